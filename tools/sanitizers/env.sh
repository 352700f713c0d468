# tools/sanitizers/env.sh -- sanitizer run-time options for the build-asan
# tests and the fuzz targets; sourced by tools/run_sanitizers.sh. Every
# setting is explained in docs/reliability.md ("Suppressions and options").
_asap_san_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS="detect_odr_violation=0:detect_leaks=1:allocator_may_return_null=1:halt_on_error=1:abort_on_error=0:strict_init_order=0:detect_stack_use_after_return=0:fast_unwind_on_malloc=0:suppressions=$_asap_san_dir/asan.supp${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$_asap_san_dir/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$_asap_san_dir/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
unset _asap_san_dir
