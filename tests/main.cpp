// tests/main.cpp: the doctest main, alone in its TU so it compiles once; every tests/test_*.cpp links to it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
