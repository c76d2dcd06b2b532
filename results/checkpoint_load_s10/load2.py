import sys, time, resource
root = sys.argv[1]; sys.path.insert(0, root)
from pathlib import Path
from executor.core import checkpoint
from txn_library import native
import tpcc.schema
assert checkpoint.__file__.startswith(root), checkpoint.__file__
p = Path(sys.argv[2])
checkpoint.read_info(p)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0=time.perf_counter(); info, s = checkpoint.load(p); t1=time.perf_counter()
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"{root} {native.describe()[:8]} load {t1-t0:.3f}s user {r1.ru_utime-r0.ru_utime:.3f} sys {r1.ru_stime-r0.ru_stime:.3f} rows {s.row_count()}")
