"""benchmarks/profile_update.py: samples classed by the code they were in, split by thread."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import profile_update as pu

from sb3_amago.nets import cpu_kernels

TORCH = "/site-packages/torch/lib"
# Lines as `perf script -F tid,ip,sym,dso -G` prints them: main thread 100, an OpenMP worker 101.
LINES = [
    " 100      7efc426c02f9 [unknown] (/tmp/perf-100.map)",
    " 100      7efc426c02f9 [unknown] (/tmp/perf-100.map)",
    " 100      7efc79c1b4be mkl_blas_def_sgemm_kernel_0_zen (" + TORCH + "/libtorch_cpu.so)",
    " 100      7efc48061eab cpp_fused__softmax_backward_data_view_17._omp_fn.0 (/tmp/torchinductor_root/6n/c6ns.main.so)",
    " 100      7efc79c1b4be (anonymous namespace)::copy_same_type_transpose_(at::Tensor&) (" + TORCH + "/libtorch_cpu.so)",
    " 100      7efc79c1b4be c10::impl::OperatorEntry::lookup (" + TORCH + "/libtorch_cpu.so)",
    " 100      7efc79c1b4be c10::function_ref<void (char**, long)>::callback_fn<at::native::leaky_relu_kernel> ("
    + TORCH
    + "/libtorch_cpu.so)",
    " 100      fb610 _PyEval_EvalFrameDefault (/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0)",
    " 100      7efc79c1e02a [unknown] (" + TORCH + "/libgomp.so.1)",
    " 101      7efc79c1de62 [unknown] (" + TORCH + "/libgomp.so.1)",
    " 101      7efc42a004d9 [unknown] (/tmp/perf-100.map)",
    "",
    "not a sample line",
]


def test_classify_names_the_code_a_sample_was_in() -> None:
    assert pu.classify("[unknown]", "/tmp/perf-100.map") == pu.PRODUCTS
    assert pu.classify("py::train:/x/amago.py", "/tmp/perf-100.map") == pu.HOST
    assert pu.classify("dnnl::impl::primitive_hashing::get_md_hash", TORCH + "/libtorch_cpu.so") == pu.PRODUCTS
    assert pu.classify("cpp_fused_stack_14._omp_fn.0", "/tmp/torchinductor_root/x/abc.main.so") == pu.COMPILED
    assert pu.classify("Sleef_finz_expf16_u10avx512f", TORCH + "/libtorch_cpu.so") == pu.NATIVE
    assert pu.classify("c10::impl::OperatorEntry::lookup", TORCH + "/libtorch_cpu.so") == pu.HOST
    assert pu.classify("_int_malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6") == pu.HOST
    assert pu.classify("[unknown]", TORCH + "/libgomp.so.1") == pu.WAIT
    kernel = "/root/.cache/torch_extensions/py311_cpu/x/" + cpu_kernels.build_name("AVX512") + "_v1.so"
    assert pu.classify("(anonymous namespace)::tile<8, 2, false>", kernel) == pu.ATTENTION
    assert pu.classify("dropout::fill_avx512(float*, unsigned long, long, long, unsigned int, float)", kernel) == pu.NATIVE


def test_shares_split_the_main_thread_from_the_workers() -> None:
    shares = pu.thread_shares(pu.samples(LINES), main_tid=100)
    main, workers = shares[pu.MAIN], shares[pu.WORKERS]
    assert main["samples"] == 9 and workers["samples"] == 2
    assert main[pu.PRODUCTS] == pytest.approx(3 / 9)
    assert (main[pu.COMPILED], main[pu.NATIVE], main[pu.WAIT], main[pu.HOST]) == pytest.approx((1 / 9, 2 / 9, 1 / 9, 2 / 9))
    assert (workers[pu.WAIT], workers[pu.PRODUCTS]) == (0.5, 0.5)


def test_top_symbols_rank_one_class_of_the_main_thread() -> None:
    top = pu.top_symbols(pu.samples(LINES), main_tid=100, klass=pu.HOST, n=5)
    assert top == [
        ("c10::impl::OperatorEntry::lookup [libtorch_cpu.so]", 1 / 9),
        ("_PyEval_EvalFrameDefault [libpython3.11.so.1.0]", 1 / 9),
    ]
    assert pu.top_symbols(pu.samples(LINES), main_tid=100, klass=pu.PRODUCTS, n=1) == [("[unknown] [perf-100.map]", 2 / 9)]


def _perf_can_record() -> bool:
    if shutil.which("perf") is None:
        return False
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    return paranoid.exists() and int(paranoid.read_text()) <= 2


@pytest.mark.skipif(not _perf_can_record(), reason="perf is not installed or may not sample processes here")
def test_profile_samples_a_running_update() -> None:
    lines, main_tid, update_ms = pu.profile(threads=1, length=8, updates=30, compile_model=False, frequency=999)
    main = pu.thread_shares(pu.samples(lines), main_tid)[pu.MAIN]
    assert update_ms > 0 and main["samples"] > 0
    assert sum(main[name] for name in pu.CLASSES) == pytest.approx(1.0)
    assert main[pu.HOST] > 0, "an eager update runs Python on the main thread"
