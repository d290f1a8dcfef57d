"""Put on a worker's PYTHONPATH by the Endure agent (with ENDURE_AUTOSTEP=1):
arms endure.autostep, the step progress of an unmodified PyTorch program,
then runs the sitecustomize this one stands in front of (Debian's, a
virtualenv's), as if this one were not there. See endure/autostep.py."""


def _arm():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from endure import autostep
        autostep.install()
    except Exception as e:  # never into the program
        print(f"endure.autostep: off: {e!r}", file=sys.stderr, flush=True)
    # The next sitecustomize on the path, behind this directory.
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_arm()
del _arm
