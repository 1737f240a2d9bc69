/* examples/torch-rl end to end (tests/python/rl_e2e_*.py: GRPO on a local
 * fleet), run by the same driver as test_python, in a binary of its own so
 * that each stays well inside the runner's time limit. */
#define PY_GLOB "tests/python/rl_e2e_*.py"
#include "test_python.c"
