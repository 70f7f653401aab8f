// tests/main.cpp: the doctest main, alone in its TU so it compiles once; every tests/test_*.cpp links to it.
// TcpTransport links are TLS unless plaintext is asked for: the tests run with a throwaway cluster CA,
// its certificates in a directory named by PSS_TLS_DIR, as pss-launch gives a launched cluster.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <pss/transport/tcp/tls.hpp>

namespace {

/// Writes ca.crt and <job>-<index>.crt and .key for up to 8 tasks of each job into a new directory,
/// removed again at exit.
struct TlsDirectory {
    std::filesystem::path path;

    TlsDirectory() {
#if PSS_HAS_TLS
        std::string pattern = (std::filesystem::temp_directory_path() / "pss_tests_tls_XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) return;
        path = pattern;
        std::vector<pss::TaskId> tasks;
        for (const char* job : {"chief", "ps", "worker", "evaluator"})
            for (int i = 0; i < 8; ++i) tasks.push_back(pss::TaskId{job, i});
        pss::TlsAuthority("pss tests CA").write_directory(path, tasks);
        ::setenv("PSS_TLS_DIR", path.c_str(), 1);
#endif
    }
    ~TlsDirectory() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
};

}  // namespace

int main(int argc, char** argv) {
    const TlsDirectory tls;
    return doctest::Context(argc, argv).run();
}
