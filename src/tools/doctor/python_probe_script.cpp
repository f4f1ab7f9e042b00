// The probe `lockstep doctor` runs inside each Python interpreter, one framework per run:
// `python -c <this> torch`. It imports the framework as the user's program would and prints
// what the framework itself reports (its CUDA, cuDNN and NCCL, whether it finds a GPU and
// what it warns while looking), which NCCL libraries the import mapped, and the nvidia-*
// wheels installed, as one JSON line after kProbeMarker. It never raises: a failing import
// is reported as such; one that crashes
// or hangs Python leaves the first line, printed before it.
#include "tools/doctor/python_stack.h"

namespace lockstep::tools {

const char* const kPythonProbeScript = R"PY(import ctypes, json, logging, os, re, sys, warnings

def externally_managed():
    # PEP 668: a distribution's own Python (Debian's, Ubuntu's) refuses `pip install`.
    try:
        import sysconfig
        return os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
    except Exception:
        return False

name = sys.argv[1] if len(sys.argv) > 1 else ""
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
report = {"python": sys.version.split()[0], "prefix": sys.prefix,
          "virtualenv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
          "conda": os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
          "externally_managed": externally_managed(),
          "framework": {"name": name, "installed": False}}
framework = report["framework"]

def described(error):
    return "%s: %s" % (type(error).__name__, str(error).strip().splitlines()[0] if str(error).strip() else "")

def asked(function):
    try:
        return function(), ""
    except Exception as error:
        return None, described(error)

def dotted(code):
    # cuDNN 8 and NCCL before 2.9 count the major in thousands, later ones in ten thousands.
    code = int(code)
    scale = 10000 if code >= 10000 else 1000
    return "%d.%d.%d" % (code // scale, code % scale // 100, code % 100)

def wheels(prefixes):
    found = {}
    try:
        from importlib import metadata
        for dist in metadata.distributions():
            dist_name = (dist.metadata["Name"] or "").lower()
            if any(dist_name.startswith(p) for p in prefixes):
                found[dist_name] = dist.version
    except Exception:
        pass
    return found

def loaded_nccl():
    libraries = []
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "/libnccl" in line})
    except OSError:
        return libraries
    for path in paths:
        version = ""
        try:
            code = ctypes.c_int(0)
            if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) == 0:
                version = dotted(code.value)
        except Exception:
            pass
        libraries.append({"path": os.path.realpath(path), "version": version})
    return libraries

class Recorded(logging.Handler):
    def __init__(self):
        logging.Handler.__init__(self, logging.WARNING)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def looking_for_gpus(function):
    # What the framework warns or logs while it looks, e.g. "the NVIDIA driver on your system is too old".
    handler = Recorded()
    logging.getLogger().addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, error = asked(function)
    logging.getLogger().removeHandler(handler)
    said = [str(w.message).strip() for w in caught] + handler.messages + ([error] if error else [])
    framework["warnings"] = [m for m in said if m]
    return result

def probe_torch():
    import torch
    framework["version"] = torch.__version__
    framework["cuda"] = getattr(torch.version, "cuda", None) or ""
    framework["rocm"] = getattr(torch.version, "hip", None) or ""
    if framework["cuda"]:
        version, framework["cudnn_error"] = asked(torch.backends.cudnn.version)
        framework["cudnn"] = dotted(version) if version else ""
        def nccl_version():
            nccl = getattr(torch.cuda, "nccl", None)
            if nccl is None:
                import importlib
                nccl = importlib.import_module("torch.cuda.nccl")
            return nccl.version()
        version, framework["nccl_error"] = asked(nccl_version)
        if isinstance(version, (tuple, list)):
            framework["nccl"] = ".".join(str(part) for part in version)
        elif version:
            framework["nccl"] = dotted(version)
    if framework["cuda"] or framework["rocm"]:
        usable = looking_for_gpus(torch.cuda.is_available)
        framework["gpu_usable"] = bool(usable)
        framework["gpu_count"] = int(torch.cuda.device_count()) if usable else 0
    framework["wheels"] = wheels(("nvidia-",))

def probe_tensorflow():
    import tensorflow as tf
    framework["version"] = tf.__version__
    info, _ = asked(tf.sysconfig.get_build_info)
    info = info or {}
    if info.get("is_cuda_build"):
        framework["cuda"] = str(info.get("cuda_version", "") or "")
        framework["cudnn"] = str(info.get("cudnn_version", "") or "")
        gpus = looking_for_gpus(lambda: tf.config.list_physical_devices("GPU"))
        framework["gpu_usable"] = bool(gpus)
        framework["gpu_count"] = len(gpus or [])
    framework["wheels"] = wheels(("nvidia-",))

def probe_jax():
    import jax
    framework["version"] = jax.__version__
    plugins = wheels(("jax-cuda", "jaxlib", "nvidia-"))
    framework["wheels"] = plugins
    try:
        from jax._src.lib import cuda_versions
    except Exception:
        cuda_versions = None
    if cuda_versions is not None:
        runtime, _ = asked(lambda: cuda_versions.cuda_runtime_build_version())
        if runtime:
            framework["cuda"] = "%d.%d" % (runtime // 1000, runtime % 1000 // 10)
        cudnn, _ = asked(lambda: cuda_versions.cudnn_build_version())
        if cudnn:
            framework["cudnn"] = dotted(cudnn)
    if not framework.get("cuda"):
        majors = [m.group(1) for m in (re.match(r"jax-cuda(\d+)-(plugin|pjrt)$", n) for n in plugins) if m]
        framework["cuda"] = max(majors, key=int) if majors else ""
    if framework["cuda"]:
        devices = looking_for_gpus(lambda: jax.devices("gpu"))
        framework["gpu_usable"] = bool(devices)
        framework["gpu_count"] = len(devices or [])

probes = {"torch": probe_torch, "tensorflow": probe_tensorflow, "jax": probe_jax}
try:
    import importlib.util
    installed = name in probes and importlib.util.find_spec(name) is not None
except Exception:
    installed = False
def answer(done):
    report["done"] = done
    print("lockstep-doctor-probe: " + json.dumps(report), flush=True)

if installed:
    framework["installed"] = True
    # A first answer before the import, so an import that crashes or hangs Python is told
    # apart from an interpreter that cannot run at all.
    answer(False)
    try:
        framework["location"] = os.path.dirname(importlib.util.find_spec(name).origin or "")
        probes[name]()
    except Exception as error:
        framework["import_error"] = described(error)
    framework["loaded_nccl"] = loaded_nccl()
answer(True)
)PY";

}  // namespace lockstep::tools
