// tests/consumers/version_probe.cpp: stand-in consumer program, used only while
// examples/seed_variable.cpp (with its .expected) does not exist.
#include <iostream>

#include <pss/pss.hpp>

int main() {
    std::cout << "pss " << PSS_VERSION_MAJOR << '.' << PSS_VERSION_MINOR << '.' << PSS_VERSION_PATCH << '\n';
}
