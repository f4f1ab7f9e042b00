#!/usr/bin/python3
"""Data-parallel training across a slow link: plain ddp and the cures for it, Lockstep beside
PyTorch DDP (gloo) and its communication hooks, on two test hosts (scripts/test-hosts: network
namespaces whose links are shaped to --rate) in the same run. Two ranks, one per host, one
compute thread each; one global batch, the same number of steps and the same SGD for every row.

  lockstep ddp                 `lockstep train --strategy ddp --backend mpi` under mpirun
  lockstep <cure>              the same with a cure's flags (CURES below); "not built" when
                               `lockstep train --help` lacks the flag
  torch ddp                    bench/torch_ddp.py --from-env, one copy inside each host
  torch <hook>                 the same with fp16_compress_hook, PowerSGD or post-localSGD

Each row: samples/s over the training loop (lockstep: summary.json's samples_per_second,
rank 0's clock, evaluation and the final checkpoint excluded; PyTorch: bench/torch_ddp.py's
timer between two barriers), MB sent per step (the TX bytes of both hosts' interfaces in
/proc/net/dev over the whole run, launch, rendezvous and TCP headers included, / steps), the
test accuracy on the 10000 test images after training, and samples/s as a multiple of its own
side's plain ddp and of its PyTorch counterpart. Needs root; prints "SKIP reason" when test
hosts cannot be made. The hosts are removed on exit, on an error and on SIGINT/SIGTERM.

    /usr/bin/python3 bench/slow_link.py [--models mlp,cnn] [--batch 256] [--epochs 1] [--rate 1gbit]
    /usr/bin/python3 bench/slow_link.py --models mlp --steps 30 --json
"""

import argparse
import datetime
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data_parallel import GRADIENT_BYTES, LOCKSTEP, ROOT  # noqa: E402

POWERSGD_RANK = 4
POWERSGD_START = 10  # plain all-reduces before this step, on both sides (Lockstep's default)
LOCALSGD_PERIOD = 8
# A cure: its row, `lockstep train`'s flags for it (each looked for in --help), and
# bench/torch_ddp.py's --hook it is set beside (None: no PyTorch counterpart).
CURES = [
    ("lockstep bf16 grads", ["--grad-dtype", "bf16"], "fp16"),
    ("lockstep sync every 8", ["--sync-every", str(LOCALSGD_PERIOD)], "localsgd"),
    ("lockstep powersgd r4", ["--powersgd-rank", str(POWERSGD_RANK), "--powersgd-start", str(POWERSGD_START)],
     "powersgd"),
]
# PyTorch's rows, by --hook.
TORCH_ROWS = {
    "none": "torch ddp",
    "fp16": "torch fp16_compress_hook",
    "powersgd": f"torch PowerSGD r{POWERSGD_RANK}",
    "localsgd": f"torch post-localSGD p{LOCALSGD_PERIOD}",
}
# Said in the table beside a counterpart that is more than a DDP hook.
TORCH_NOTES = {"localsgd": "DDP hooks have none: post_localSGD_hook + PeriodicModelAverager"}

TEST_HOSTS = os.path.join(ROOT, "scripts", "test-hosts")
# Names and a subnet of this benchmark's own, apart from the tests' (lst, lh<N>).
HOSTS_PREFIX, HOSTS_NET = "lsb", 201
HOSTS = 2
MASTER_PORT = 29500  # inside host 0's namespace: no other process there


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_on_signals():
    """SIGINT, SIGTERM and SIGHUP raise Interrupted, so that every `finally` runs."""
    def handler(signum, frame):
        raise Interrupted(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def ignore_signals():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)


def last_line(text):
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class TestHosts:
    """scripts/test-hosts' hosts under this benchmark's names (as tests/tools/common/test_hosts.h)."""

    def __init__(self, count, rate):
        self.count, self.rate = count, rate
        self.names = {"LOCKSTEP_TEST_HOSTS_PREFIX": HOSTS_PREFIX, "LOCKSTEP_TEST_HOSTS_NET": str(HOSTS_NET)}
        self.env = dict(os.environ, **self.names)

    def up(self):
        """Makes the hosts; the reason they cannot be made, or None."""
        if os.geteuid() != 0:
            return "test hosts need root (network namespaces)"
        for tool in ("ip", "unshare", "tc"):
            if not shutil.which(tool):
                return f"test hosts need {tool}"
        made = subprocess.run([TEST_HOSTS, "up", str(self.count), "--rate", self.rate], env=self.env,
                              capture_output=True, text=True)
        return None if made.returncode == 0 else f"test hosts: {last_line(made.stderr + made.stdout)}"

    def down(self):
        subprocess.run([TEST_HOSTS, "down"], env=self.env, capture_output=True)

    def address(self, host):
        return f"10.231.{HOSTS_NET}.{11 + host}"

    def subnet(self):
        return f"10.231.{HOSTS_NET}.0/24"

    def interface(self, host):
        return f"{HOSTS_PREFIX}p{host}"

    def on(self, host, argv):
        return [TEST_HOSTS, "run", str(host)] + argv

    def tx_bytes(self):
        """Bytes every host has sent on its interface so far."""
        total = 0
        for host in range(self.count):
            dev = subprocess.run(self.on(host, ["cat", "/proc/net/dev"]), env=self.env, capture_output=True,
                                 text=True, check=True).stdout
            for line in dev.splitlines():
                name, _, counters = line.partition(":")
                if name.strip() == self.interface(host):
                    total += int(counters.split()[8])  # 8 receive counters, then transmit's bytes
                    break
            else:
                raise RuntimeError(f"no {self.interface(host)} in host {host}'s /proc/net/dev")
        return total

    def mpirun(self, per_host):
        """mpirun over the hosts, as TestHosts::mpirun builds it: the rsh agent starts each
        host's daemon inside its namespace, and all traffic stays on the hosts' subnet."""
        hosts = ",".join(f"{self.address(h)}:{per_host}" for h in range(self.count))
        exports = []
        for name in list(self.names) + ["CUDA_VISIBLE_DEVICES", "ASAN_OPTIONS"]:
            exports += ["-x", name]
        return (["mpirun", "--allow-run-as-root", "--bind-to", "none", "--host", hosts,
                 "-n", str(self.count * per_host), "--mca", "plm_rsh_agent", f"{TEST_HOSTS} rsh",
                 "--mca", "oob_tcp_if_include", self.subnet(), "--mca", "btl_tcp_if_include", self.subnet(),
                 "--mca", "btl", "self,vader,tcp"] + exports)

    def mpirun_env(self):
        asan = os.environ.get("ASAN_OPTIONS")
        return dict(self.env, CUDA_VISIBLE_DEVICES="", OMPI_MCA_btl_vader_single_copy_mechanism="none",
                    ASAN_OPTIONS=(asan + ":" if asan else "") + "detect_leaks=0")


def training_samples(data_dir):
    """The training set's image count, from its IDX header."""
    with gzip.open(os.path.join(data_dir, "train-images-idx3-ubyte.gz"), "rb") as f:
        return struct.unpack(">I", f.read(8)[4:])[0]


def wait_for_lockstep(seconds=120):
    """The binary may be mid-rebuild: wait for it to come back, up to `seconds`."""
    deadline = time.monotonic() + seconds
    while not os.access(LOCKSTEP, os.X_OK) and time.monotonic() < deadline:
        time.sleep(5)
    return os.access(LOCKSTEP, os.X_OK)


def lockstep_has_flag(flag):
    shown = subprocess.run([LOCKSTEP, "train", "--help"], capture_output=True, text=True)
    return re.search(r"(^|\s)" + re.escape(flag) + r"(\s|=|$)", shown.stdout + shown.stderr, re.M) is not None


def lockstep_run(hosts, model, extra, args, steps, out):
    """One `lockstep train` across the hosts: (samples/s, test accuracy, steps) from summary.json."""
    recipe = ["--model", model, "--strategy", "ddp", "--backend", "mpi", "--batch-size", str(args.batch),
              "--micro-batch", str(args.batch // HOSTS),  # one pass per rank, as PyTorch's
              "--steps", str(steps), "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
              "--lr-schedule", "constant", "--threads", "1", "--data", args.data]
    run = subprocess.run(hosts.mpirun(1) + [LOCKSTEP, "train", "--quiet", "--out", out] + recipe + extra,
                         env=hosts.mpirun_env(), capture_output=True, text=True, timeout=args.timeout)
    if run.returncode != 0:
        raise RuntimeError(f"lockstep train failed ({run.returncode}): {last_line(run.stderr + run.stdout)}")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    return summary["samples_per_second"], summary["test_accuracy"], summary["steps"]


def torch_run(hosts, model, hook, args, steps, port):
    """bench/torch_ddp.py, one rank inside each host, env:// at host 0: (samples/s, test accuracy, steps)."""
    script = [args.python, os.path.join(ROOT, "bench", "torch_ddp.py"), "--from-env", "--model", model,
              "--batch", str(args.batch), "--steps", str(steps), "--hook", hook, "--test", "--data", args.data,
              "--powersgd-rank", str(POWERSGD_RANK), "--powersgd-start", str(POWERSGD_START),
              "--localsgd-period", str(LOCALSGD_PERIOD)]
    ranks = []
    try:
        for host in range(hosts.count):
            env = dict(hosts.env, RANK=str(host), WORLD_SIZE=str(hosts.count), MASTER_ADDR=hosts.address(0),
                       MASTER_PORT=str(port), GLOO_SOCKET_IFNAME=hosts.interface(host), OMP_NUM_THREADS="1")
            ranks.append(subprocess.Popen(hosts.on(host, script), env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = [rank.communicate(timeout=args.timeout) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    stdout = outputs[0][0]
    for line in stdout.splitlines():
        if line.startswith("RESULT"):
            fields = dict(item.split("=") for item in line.split()[1:])
            return float(fields["samples_per_s"]), float(fields["test_accuracy"]), steps
        if line.startswith("SKIP"):
            raise RuntimeError(line)
    failed = next((r for r, p in enumerate(ranks) if p.returncode != 0), 0)
    raise RuntimeError(f"rank {failed} failed ({ranks[failed].returncode}): "
                       f"{last_line(outputs[failed][1] + outputs[failed][0])}")


def busy_cpu_seconds():
    """CPU time this machine has spent busy so far, every process's (other users' too)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def visible_cpu_seconds():
    """CPU time of every process in this PID namespace, with the children each has reaped
    (orphans go to pid 1, also counted): what is missing from busy_cpu_seconds() belongs to
    processes out of sight, such as another user's build, or to the kernel's interrupts."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # from field 3 (state) on
        ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(hosts, run):
    """Runs `run`; its row's figures, with the bytes both hosts sent per step and the cores
    kept busy meanwhile by processes out of sight (the ranks share these cores)."""
    before, busy, seen, start = hosts.tx_bytes(), busy_cpu_seconds(), visible_cpu_seconds(), time.monotonic()
    rate, accuracy, steps = run()
    others = (busy_cpu_seconds() - busy - (visible_cpu_seconds() - seen)) / (time.monotonic() - start)
    sent = hosts.tx_bytes() - before
    return {"samples_per_s": rate, "bytes_per_step": sent / steps, "test_accuracy": accuracy, "steps": steps,
            "others_cores": max(0.0, others)}


def plan(model, args, steps, scratch):
    """The rows of one model, each a PyTorch counterpart right after its Lockstep row:
    (row, side, hook of its counterpart, the flags to look for, how to run it)."""
    def lockstep(name, extra):
        out = os.path.join(scratch, f"{model}-{name}")
        return lambda hosts, port: lockstep_run(hosts, model, extra, args, steps, out)

    def torch(hook):
        return lambda hosts, port: torch_run(hosts, model, hook, args, steps, port)

    rows = [("lockstep ddp", "lockstep", "none", [], lockstep("ddp", [])),
            (TORCH_ROWS["none"], "torch", None, [], torch("none"))]
    for name, flags, hook in CURES:
        wanted = [flag for flag in flags if flag.startswith("--")]
        rows.append((name, "lockstep", hook, wanted, lockstep(name.replace(" ", "-"), flags)))
        if hook:
            rows.append((TORCH_ROWS[hook], "torch", None, [], torch(hook)))
    return rows


def run_rows(hosts, model, args, steps, scratch, port):
    """Measures one model's rows; each row a dict, with "error" or "not built" where it did not run."""
    results = []
    for name, side, hook, flags, run in plan(model, args, steps, scratch):
        row = {"model": model, "row": name, "side": side, "counterpart": TORCH_ROWS.get(hook) if hook else None}
        if hook in TORCH_NOTES:
            row["counterpart_note"] = TORCH_NOTES[hook]
        print(f"slow_link: {model}: {name} ...", file=sys.stderr, flush=True)
        try:
            if side == "lockstep":
                if not wait_for_lockstep():
                    raise RuntimeError(f"{LOCKSTEP} is not built")
                missing = [flag for flag in flags if not lockstep_has_flag(flag)]
                if missing:
                    row["not_built"] = f"lockstep train has no {' '.join(missing)}"
                    results.append(row)
                    continue
            port += 1  # PyTorch's rendezvous: a fresh port, the last run's may linger in TIME_WAIT
            row.update(measure(hosts, lambda: run(hosts, port)))
        except (RuntimeError, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
            row["error"] = str(e)
        results.append(row)
    add_ratios(results)
    return results, port


def add_ratios(rows):
    """Each row's samples/s over its own side's plain ddp, and over its PyTorch counterpart."""
    by_name = {row["row"]: row for row in rows if "samples_per_s" in row}
    plain = {"lockstep": by_name.get("lockstep ddp"), "torch": by_name.get(TORCH_ROWS["none"])}
    for row in rows:
        if "samples_per_s" not in row:
            continue
        if plain[row["side"]]:
            row["vs_plain"] = row["samples_per_s"] / plain[row["side"]]["samples_per_s"]
        counterpart = by_name.get(row["counterpart"]) if row["counterpart"] else None
        if counterpart:
            row["vs_counterpart"] = row["samples_per_s"] / counterpart["samples_per_s"]


def counterpart_text(row):
    if row["side"] == "torch":
        return ""
    if not row["counterpart"]:
        return "none in PyTorch"
    ratio = f"{row['vs_counterpart']:.2f}x " if "vs_counterpart" in row else "- "
    note = f" ({row['counterpart_note']})" if "counterpart_note" in row else ""
    return f"{ratio}{row['counterpart']}{note}"


def print_table(rows):
    print(f"{'model':5} {'row':26} {'samples/s':>9} {'MB/step':>8} {'test acc':>8} {'others':>6} {'vs plain':>8}  "
          "vs PyTorch")
    for row in rows:
        start = f"{row['model']:5} {row['row']:26}"
        if "not_built" in row or "error" in row:
            print(f"{start} {'not built' if 'not_built' in row else 'failed':>9}  "
                  f"{row.get('not_built') or row.get('error')}")
            continue
        plain = f"{row['vs_plain']:.2f}x" if "vs_plain" in row else "-"
        print(f"{start} {row['samples_per_s']:9.0f} {row['bytes_per_step'] / 1e6:8.3f} {row['test_accuracy']:8.4f} "
              f"{row['others_cores']:6.2f} {plain:>8}  {counterpart_text(row)}".rstrip())


def header(args, hosts, steps):
    return {
        "rate": args.rate,
        "hosts": [f"{HOSTS_PREFIX}-h{h} {hosts.address(h)}" for h in range(hosts.count)],
        "ranks": HOSTS,
        "batch": args.batch,
        "steps": steps,
        "samples_per_run": steps * args.batch,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_at_start": os.getloadavg()[0],
    }


def print_header(info, models):
    print(f"slow link: {info['rate']} out of each of {len(info['hosts'])} test hosts ({', '.join(info['hosts'])})")
    print(f"{info['ranks']} ranks, one per host, 1 compute thread each; global batch {info['batch']} "
          f"({info['batch'] // info['ranks']} per rank, one pass); {info['steps']} steps, "
          f"{info['samples_per_run']} samples per run; SGD lr 0.05 momentum 0.9, constant")
    print(f"PowerSGD: rank {POWERSGD_RANK} from step {POWERSGD_START} on both sides; PyTorch's other defaults "
          "(error feedback, warm start, min_compression_rate 2), one DDP bucket")
    print(f"post-localSGD: local steps from the start, the parameters averaged every {LOCALSGD_PERIOD} steps "
          "(Lockstep's --sync-every averages the optimizer state too)")
    print("samples/s: the training loop's (lockstep: summary.json samples_per_second; PyTorch: between barriers)")
    print("MB/step: both hosts' TX bytes over the whole run (launch, rendezvous, TCP included) / steps; "
          + ", ".join(f"{m} f32 gradients {GRADIENT_BYTES[m] / 1e6:.2f} MB" for m in models if m in GRADIENT_BYTES))
    print("others: cores kept busy during the row by processes out of this PID namespace (another user's build) "
          f"and the kernel's interrupts; the {info['ranks']} ranks share this machine's {os.cpu_count()} cores, so more than a "
          "few tenths slows the row")
    print(f"date: {info['date']}; 1-minute load average at the start {info['load_at_start']:.2f}, "
          f"at the end {info['load_at_end']:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--batch", type=int, default=256, help="global batch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="steps per run instead of --epochs' (0: --epochs')")
    parser.add_argument("--rate", default="1gbit", help="each host's outgoing link (tc rate: 1gbit, 100mbit)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--python", default="/usr/bin/python3")
    args = parser.parse_args()
    if args.batch % HOSTS:
        sys.exit(f"--batch must divide into {HOSTS} ranks")
    models = args.models.split(",")
    steps = args.steps or args.epochs * (training_samples(args.data) // args.batch)  # short batches dropped

    hosts = TestHosts(HOSTS, args.rate)
    scratch = tempfile.mkdtemp(prefix="lockstep-slow-link-")
    raise_on_signals()
    try:
        why = hosts.up()
        if why:
            print(f"SKIP {why}")
            return 0
        info = header(args, hosts, steps)
        rows, port = [], MASTER_PORT
        for model in models:
            measured, port = run_rows(hosts, model, args, steps, scratch, port)
            rows += measured
        info["load_at_end"] = os.getloadavg()[0]
        if args.json:
            for row in rows:
                print(json.dumps(dict(info, **row)))
        else:
            print_header(info, models)
            print_table(rows)
        return 0
    except Interrupted as e:
        print(f"slow_link: stopped by {e}; the test hosts are removed", file=sys.stderr)
        return 128 + e.signum
    finally:
        ignore_signals()  # a second Ctrl-C must not stop the clean-up
        hosts.down()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
