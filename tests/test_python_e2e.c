/* The PyTorch example end to end (tests/python/e2e_*.py: a trainer and two
 * followers on a real push tree), run by the same driver as test_python. */
#define PY_GLOB "tests/python/e2e_*.py"
#include "test_python.c"
