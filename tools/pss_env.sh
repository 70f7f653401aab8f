# tools/pss_env.sh: sourced by tools/*.sh. Installs the Debian packages pss needs when one is missing.
# Shared helpers only; no side effect beyond the package check when sourced.

PSS_DEBIAN_PACKAGES=(g++ cmake ninja-build pkg-config python3 meson libxtensor-dev xtl-dev libxsimd-dev
                     libasio-dev libssl-dev openssl doctest-dev nlohmann-json3-dev libbenchmark-dev)

# pss_ensure_packages [extra packages...]: the packages above, and any named.
pss_ensure_packages() {
    local missing=() pkg
    for pkg in "${PSS_DEBIAN_PACKAGES[@]}" "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]} == 0)); then
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "pss: missing packages (${missing[*]}) and no apt-get: install them by hand" >&2
        return 1
    fi
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "pss: missing packages (${missing[*]}); run as root or install them: apt-get install ${missing[*]}" >&2
            return 1
        fi
    fi
    echo "pss: installing missing Debian packages: ${missing[*]}"
    "${sudo[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
}

# Parallel jobs: 2 by default (the machines this runs on are small); PSS_JOBS overrides.
PSS_JOBS=${PSS_JOBS:-2}
