#!/bin/sh
# The main job (`make run`).  Until the end-to-end RL job exists, this runs
# the delta codec on a generated checkpoint pair and prints its comparison
# against XOR+zstd-1.
set -eu
exec build/shoal bench delta --params "${SHOAL_RUN_PARAMS:-64M}"
