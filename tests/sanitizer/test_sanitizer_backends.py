"""The device backends' declarations the dispatch mode relies on."""


def test_every_backend_with_op_hooks_says_so():
    """The dispatch mode calls before_op / inside_op only on backends whose
    hooks_ops is set: a backend overriding them must set it."""
    from npu_lifetime.sanitizer import backends

    for cls in (backends.CudaBackend, backends.NpuBackend, backends.SimBackend):
        overrides = cls.before_op is not backends.Backend.before_op or cls.inside_op is not backends.Backend.inside_op
        assert cls.hooks_ops == overrides, cls.__name__
