"""What the thin client's package (cmake -DKILN_CLIENT_ONLY=ON) lacks: kiln.compile, kiln.export
and kiln.load_program need the compiler, which that build leaves out with the kernels; they raise
naming the full build. kiln.distributed, kiln.batch, kiln.nested and kiln.ao are not imported
(each needs kiln::dist, the compiler or CPU kernels)."""


def _missing(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"{name}: this is the client-only build of Kiln "
                                  f"(KILN_CLIENT_ONLY), which has no compiler; use the full build")
    call.__name__ = name.rsplit(".", 1)[-1]
    return call


compile = _missing("kiln.compile")
export = _missing("kiln.export")
load_program = _missing("kiln.load_program")
