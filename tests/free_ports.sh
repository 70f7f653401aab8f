# tests/free_ports.sh: sourced by the test scripts that give tasks fixed ports (Slurm, Open MPI, clusters
# started by hand with TF_CONFIG), so that they pick them one way.
# shellcheck shell=bash

# free_ports N [BELOW]: N free TCP ports of the kernel's choosing (one per line); with BELOW, a base P
# such that P..P+N-1 are all free, under the kernel's ephemeral range so that srun's own sockets
# (which take ephemeral ports) cannot take them between this check and the tasks' listen.
free_ports() {
  python3 - "$@" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
if len(sys.argv) == 2:
    socks = [socket.socket() for _ in range(n)]
    for s in socks: s.bind(("", 0))
    print("\n".join(str(s.getsockname()[1]) for s in socks))
    sys.exit(0)
below = int(sys.argv[2])
for _ in range(500):
    base = random.randrange(10000, below - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); socks.append(s); s.bind(("", p))
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
else:
    sys.exit("no %d free consecutive ports below %d" % (n, below))
EOF
}
