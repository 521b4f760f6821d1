"""The Triton decode kernels' compiled variants, computed on the host: which variant a launch runs
on a given GPU (``variant_key``), and that variant compiled to PTX (``compile_for_gpu``), with no
GPU present. Triton compiles one variant of a kernel per specialization of its arguments (an
integer equal to 1 or divisible by 16, a pointer aligned to 16 bytes, the constexprs), each the
first time a launch meets it; these functions run Triton 3.9's own specialization code
(``triton.runtime.jit``, internals that may move in another release) on a ``triton_attention.Launch``,
so the CPU tests can check that an engine's warm-up launches every variant its run meets
(``tests/wings/fast_paths/test_triton_attention.py``) and read the kernels' PTX, registers and spills
(``tests/wings/fast_paths/test_triton_ptx.py``).
"""

from __future__ import annotations

import functools

import triton

from minieng.wings.fast_paths.triton_attention import Launch


@functools.cache
def _binder(kernel, arch: int):
    """The compiled-mode twin of ``kernel`` (the same function and specialization lists, when
    ``kernel`` runs interpreted), triton's backend for sm_``arch`` and the argument binder that
    ``JITFunction.run`` builds from them (triton 3.9's ``triton.runtime.jit``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    twin = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)
    backend = make_backend(GPUTarget("cuda", arch, 32))
    return twin, backend, create_function_from_signature(twin.signature, twin.params, backend)


def _bind(launch: Launch, arch: int):
    """What ``launch`` binds on an sm_``arch`` GPU, as ``JITFunction.run`` computes it: the
    compiled-mode kernel, the backend, the keyword arguments, and the bound arguments,
    specialization and options."""
    from triton import knobs

    kernel, backend, binder = _binder(launch.kernel, arch)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):  # triton 3.9's; 3.6 has no such knob
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    return kernel, backend, kwargs, bound_args, specialization, options


def variant_key(launch: Launch, arch: int = 90) -> str:
    """The name of the compiled variant ``launch`` would run on an sm_``arch`` GPU: Triton's kernel
    name and its cache key (argument types, specializations, options), computed on the host with
    triton's own specialization code, so a CPU test can tell which launches share a variant.
    Relies on triton 3.9's internals (``triton.runtime.jit``)."""
    from triton.runtime.jit import compute_cache_key

    kernel, _, _, _, specialization, options = _bind(launch, arch)
    return kernel.fn.__name__ + ":" + compute_cache_key({}, specialization, options)


def compile_for_gpu(launch: Launch, arch: int):
    """Compile ``launch``'s variant for an sm_``arch`` GPU on the host, as the launch would
    (``JITFunction.run``'s specialization, ``triton.compile``): a ``CompiledKernel`` whose
    ``asm["ptx"]`` is the PTX. Needs triton running compiled (not ``INTERPRETED``), no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, backend, kwargs, bound_args, specialization, options = _bind(launch, arch)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    source = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options.__dict__)
