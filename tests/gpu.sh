#!/usr/bin/env bash
# Every test that runs on a CUDA GPU: the kernel tests (each against its reference, on CUDA where one is
# present, bf16 too), the gpu-marked ones and the compiled-decode tests; one file at a time, each under its
# own time limit (LIMIT seconds, default 300), so that one slow file cannot hide the others' results.
# Prints each file's summary line and its failures with their short tracebacks; exits 1 if any failed.
#
#   bash tests/gpu.sh                      (on a machine with a CUDA GPU, from the repository root)
#   LIMIT=120 bash tests/gpu.sh tests/kernels/test_commits.py
set -u
LIMIT=${LIMIT:-300}
if [ $# -gt 0 ]; then files=("$@"); else
    files=(tests/kernels/test_*.py tests/test_conversion.py tests/test_distill.py tests/test_row_products.py tests/test_bench_cuda.py
           tests/test_bench_workers.py tests/test_fused_products.py)
fi
status=0
for f in "${files[@]}"; do
    echo "== $f"
    timeout "$LIMIT" python -m pytest "$f" -q -p no:cacheprovider --tb=short -rf -W ignore::UserWarning \
        > /tmp/gpu_tests.log 2>&1
    rc=$?
    grep -E "^(FAILED|ERROR)|^E |^[^ ].*(passed|failed|error)" /tmp/gpu_tests.log | cut -c1-300 | tail -40
    if ! grep -qE "^[^ ].*(passed|failed|error)" /tmp/gpu_tests.log; then  # no summary: pytest itself failed
        echo "$f: no pytest summary; the log ends:"; tail -5 /tmp/gpu_tests.log | cut -c1-300
    fi
    if [ $rc -eq 124 ]; then echo "$f: stopped at the time limit ($LIMIT s)"; fi
    if [ $rc -ne 0 ]; then status=1; fi
done
exit $status
