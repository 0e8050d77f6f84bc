#!/usr/bin/env python3
"""Baseline for issue 20: what a PyTorch user would pick instead of onlineps.

torch.distributed.rpc (TensorPipe backend, TCP on loopback unless --transport says
otherwise) in the shape caller -> trainer (rpc_sync) -> one parameter server (rpc_sync),
for the model "mlp 64-32-10" (Linear(64,32), ReLU, Linear(32,10), cross-entropy, batch
size 1, random float features, labels 0..9). The script starts three processes itself
(world size 3, MASTER_ADDR 127.0.0.1, a free port picked at run time):
  rank 0 "ps"       holds the parameters (plain SGD, --lr, a lock around the update) and
                    answers get_params() and apply_grads(grads);
  rank 1 "trainer"  holds no state; infer(x) pulls the parameters from the PS and returns
                    the logits; learn(x, y) pulls them, runs forward + backward, pushes
                    the gradients to the PS and returns the loss;
  rank 2 "caller"   runs N concurrent callers (threads, each rpc_sync to the trainer in a
                    loop) for each N in --callers.
For each N it measures infer b1 calls/s, learn b1 calls/s and the CPU time the trainer
and the PS processes use per call (utime + stime from /proc/PID/stat, before and after
the phase, divided by the calls done). Each phase runs --warmup s, then --seconds s.
Every process runs torch.set_num_threads(1).

Output: one human-readable line per figure on stdout; with --json those lines go to
stderr and stdout carries one JSON object (keys infer_b1_c1_per_s, learn_b1_c1_per_s,
cpu_ms_per_learn_c1, cpu_ms_per_infer_c1, ... for every N), so that a C++ bench can run
this script as a subprocess and print ratios next to its own figures.

Exit status: 0 measured; 1 a process failed or timed out; 2 bad flags; 3 torch (with
torch.distributed.rpc) is not importable (Debian 12: apt-get install python3-torch);
130 interrupted. Ctrl-C or an error stops all three processes (none is left behind,
even if this script is killed: they die with it).
"""
import argparse
import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

ROLES = ("ps", "trainer", "caller")
WORLD_SIZE = len(ROLES)
PROG = "torch_rpc_baseline"
TORCH_MISSING_EXIT = 3
DEBIAN_PYTHON = "/usr/bin/python3"  # where Debian's python3-torch lives
REEXEC_ENV = "ONLINEPS_TORCH_RPC_BASELINE_REEXEC"


def parse_args():
    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        pass
    p = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    a = p.add_argument
    a("--seconds", type=float, default=3.0, metavar="S", help="measured seconds of each phase")
    a("--warmup", type=float, default=0.5, metavar="S",
      help="seconds of calls before each phase's measurement starts (not counted)")
    a("--callers", default="1,8", metavar="N,N",
      help="concurrent callers (threads in the caller process) of each pair of phases")
    a("--json", action="store_true",
      help="print one JSON object on stdout (the human-readable lines go to stderr)")
    a("--lr", type=float, default=0.01, help="SGD learning rate of the PS")
    a("--rpc-threads", type=int, default=16, metavar="N",
      help="num_worker_threads of each process's TensorPipe agent; must exceed the largest "
           "--callers (every trainer call holds one RPC thread in its nested rpc_sync to the PS)")
    a("--rpc-timeout-s", type=float, default=60, metavar="S", help="timeout of one RPC")
    a("--transport", choices=("uv", "shm", "auto"), default="uv",
      help="TensorPipe transport: uv is TCP on loopback (what onlineps's tcp:// figures "
           "compare with, and what processes on different hosts get); auto lets TensorPipe "
           "choose, which is shm between processes of one host: its reactor thread busy-polls "
           "(~0.7 core per idle process measured on a 2-core VM), so on a small machine it "
           "slows every figure and inflates the CPU per call")
    a("--seed", type=int, default=0, help="seed of the initial parameters and of the inputs")
    a("--timeout-s", type=float, default=0, metavar="S",
      help="kill everything and fail after S seconds "
           "(0: 120 + 2 x (--warmup + --seconds) x len(--callers) x 2)")
    a("--role", choices=ROLES, default=None,
      help="internal: run one of the three processes (the script starts them itself, with "
           "MASTER_ADDR and MASTER_PORT in their environment)")
    args = p.parse_args()
    try:
        args.callers = [int(c) for c in args.callers.split(",") if c.strip()]
    except ValueError:
        p.error(f"--callers must be a comma-separated list of integers, got {args.callers!r}")
    if not args.callers or min(args.callers) < 1:
        p.error("--callers needs at least one value, each >= 1")
    if args.seconds <= 0 or args.warmup < 0:
        p.error("need --seconds > 0 and --warmup >= 0")
    if args.rpc_threads <= max(args.callers):
        p.error(f"--rpc-threads ({args.rpc_threads}) must exceed the largest --callers "
                f"({max(args.callers)}): each trainer call blocks one RPC thread")
    if not args.timeout_s:
        args.timeout_s = 120 + 2 * (args.warmup + args.seconds) * len(args.callers) * 2
    return args


def import_torch():
    """(torch, torch.distributed.rpc), or exit TORCH_MISSING_EXIT with a clear message.

    Where `python3` is not Debian's (pyenv, a venv) and Debian's has python3-torch, the
    script re-executes itself under /usr/bin/python3 (once) with a note on stderr."""
    try:
        import torch
        import torch.distributed.rpc as rpc
        if not rpc.is_available():
            raise ImportError("torch.distributed.rpc.is_available() is False "
                              "(torch built without distributed support)")
        return torch, rpc
    except ImportError as e:
        error = f"{type(e).__name__}: {e}"
    if (os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON)
            and os.path.exists(DEBIAN_PYTHON) and not os.environ.get(REEXEC_ENV)):
        probe = subprocess.run([DEBIAN_PYTHON, "-c", "import torch.distributed.rpc"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if probe.returncode == 0:
            print(f"{PROG}: torch is not importable by {sys.executable}; "
                  f"re-running under {DEBIAN_PYTHON}", file=sys.stderr, flush=True)
            os.environ[REEXEC_ENV] = "1"
            os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    print(f"{PROG}: torch is not importable by {sys.executable} ({error}); "
          f"install it with: apt-get install python3-torch", file=sys.stderr)
    sys.exit(TORCH_MISSING_EXIT)


# ---------------------------------------------------------------------------------------
# The three processes. RPC targets are module-level functions: they are pickled by name
# (__main__.infer, ...) and every process runs this same file as __main__.

_ps = None  # rank 0: {"params": [tensors], "lock": Lock, "lr": float, "updates": int}


def get_params():
    """PS: a copy of the parameters (copied under the lock, so no torn read)."""
    with _ps["lock"]:
        return [p.clone() for p in _ps["params"]]


def apply_grads(grads):
    """PS: one plain SGD step; returns the number of updates applied so far."""
    with _ps["lock"]:
        for p, g in zip(_ps["params"], grads):
            p.add_(g, alpha=-_ps["lr"])
        _ps["updates"] += 1
        return _ps["updates"]


def ps_updates():
    with _ps["lock"]:
        return _ps["updates"]


def getpid():
    return os.getpid()


def _forward(params, x):
    import torch.nn.functional as F
    w1, b1, w2, b2 = params
    return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def infer(x):
    """Trainer: pull the parameters from the PS, return the logits of x."""
    import torch
    import torch.distributed.rpc as rpc
    params = rpc.rpc_sync("ps", get_params)
    with torch.no_grad():
        return _forward(params, x)


def learn(x, y):
    """Trainer: pull, forward + backward, push the gradients to the PS; returns the loss."""
    import torch
    import torch.distributed.rpc as rpc
    import torch.nn.functional as F
    params = [p.requires_grad_() for p in rpc.rpc_sync("ps", get_params)]
    loss = F.cross_entropy(_forward(params, x), y)
    grads = torch.autograd.grad(loss, params)
    rpc.rpc_sync("ps", apply_grads, args=(list(grads),))
    return loss.item()


def cpu_ticks(pids):
    """utime + stime of the processes (all their threads), in clock ticks."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
        total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)
    return total


def run_phase(rpc, kind, n, inputs, labels, pids, warmup, seconds):
    """n threads call the trainer's `kind` in a loop; (calls/s, CPU ms per call, calls made)."""
    fn = infer if kind == "infer" else learn
    stop, counts, errors = threading.Event(), [0] * n, []

    def loop(i):
        k = i * 7919
        try:
            while not stop.is_set():
                j = k % len(inputs)
                args = (inputs[j],) if kind == "infer" else (inputs[j], labels[j])
                rpc.rpc_sync("trainer", fn, args=args)
                counts[i] += 1
                k += 1
        except Exception as e:  # reported by the phase, which then fails
            errors.append(f"{kind} caller {i}: {type(e).__name__}: {e}")
            stop.set()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    stop.wait(warmup)
    c0, cpu0, t0 = sum(counts), cpu_ticks(pids), time.monotonic()
    stop.wait(seconds)
    c1, cpu1, t1 = sum(counts), cpu_ticks(pids), time.monotonic()
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    calls = c1 - c0
    if calls <= 0:
        raise RuntimeError(f"{kind} with {n} callers: no call completed in {seconds} s")
    cpu_ms = (cpu1 - cpu0) * 1000.0 / os.sysconf("SC_CLK_TCK") / calls
    return calls / (t1 - t0), cpu_ms, sum(counts)


def drive(torch, rpc, args):
    """Rank 2: every phase; one JSON line per phase on stdout ("PHASE {...}")."""
    g = torch.Generator().manual_seed(args.seed + 1)
    # Separate tensors, not rows of one: RPC would send a row's whole storage.
    inputs = [torch.randn(1, 64, generator=g) for _ in range(256)]
    labels = [torch.randint(0, 10, (1,), generator=g) for _ in range(256)]
    pids = [rpc.rpc_sync("ps", getpid), rpc.rpc_sync("trainer", getpid)]
    for pid in pids:
        cpu_ticks([pid])  # /proc readable: fail now rather than mid-phase
    # Sanity before timing: shapes and a finite loss.
    logits = rpc.rpc_sync("trainer", infer, args=(inputs[0],))
    if tuple(logits.shape) != (1, 10):
        raise RuntimeError(f"infer returned shape {tuple(logits.shape)}, want (1, 10)")
    loss = rpc.rpc_sync("trainer", learn, args=(inputs[0], labels[0]))
    if not math.isfinite(loss):
        raise RuntimeError(f"learn returned loss {loss}")
    learns = 1
    for n in args.callers:
        for kind in ("infer", "learn"):
            per_s, cpu_ms, made = run_phase(rpc, kind, n, inputs, labels, pids,
                                            args.warmup, args.seconds)
            if kind == "learn":
                learns += made
            print("PHASE " + json.dumps({"kind": kind, "callers": n, "per_s": per_s,
                                         "cpu_ms": cpu_ms}), flush=True)
    loss = rpc.rpc_sync("trainer", learn, args=(inputs[0], labels[0]))
    print("DONE " + json.dumps({"learns": learns + 1, "ps_updates": rpc.rpc_sync("ps", ps_updates),
                                "final_loss": loss, "pids": pids}), flush=True)


def run_role(args):
    global _ps
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch, rpc = import_torch()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank = ROLES.index(args.role)
    if args.role == "ps":  # before init_rpc: the others may call as soon as it returns
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 10))
        _ps = {"params": [p.detach().clone() for p in model.parameters()],
               "lock": threading.Lock(), "lr": args.lr, "updates": 0}
    opts = {"num_worker_threads": args.rpc_threads, "rpc_timeout": args.rpc_timeout_s,
            "init_method": "env://"}
    if args.transport != "auto":
        opts["_transports"] = [args.transport]
    rpc.init_rpc(args.role, rank=rank, world_size=WORLD_SIZE,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(**opts))
    if args.role != "caller":
        rpc.shutdown()  # serves until every process has called shutdown
        return 0
    try:
        drive(torch, rpc, args)
    finally:
        rpc.shutdown()  # also on an error: the PS and the trainer are still there
    return 0


# ---------------------------------------------------------------------------------------
# The launcher.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """preexec_fn: SIGKILL the child if this script dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:
        pass


def stop_children(children, grace=5.0):
    for p in children:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace
    for p in children:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def exit_text(rc):
    return f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"


def launch(args, torch):
    """Starts the three processes, collects the caller's figures; the result dict."""
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    env.setdefault("TP_SOCKET_IFNAME", "lo")  # TensorPipe's uv transport: listen on loopback
    env.setdefault("GLOG_minloglevel", "1")  # no "RPC agent ... is shutting down" INFO lines
    common = [sys.executable, os.path.abspath(__file__),
              "--seconds", str(args.seconds), "--warmup", str(args.warmup),
              "--callers", ",".join(map(str, args.callers)), "--lr", str(args.lr),
              "--rpc-threads", str(args.rpc_threads), "--rpc-timeout-s", str(args.rpc_timeout_s),
              "--transport", args.transport, "--seed", str(args.seed)]
    out = sys.stderr if args.json else sys.stdout
    result = {"bench": PROG, "torch": torch.__version__, "backend": "tensorpipe",
              "transport": args.transport, "model": "mlp 64-32-10", "batch": 1,
              "seconds": args.seconds, "callers": args.callers, "rpc_threads": args.rpc_threads,
              "cpus": os.cpu_count()}
    print(f"{PROG}: torch {torch.__version__} torch.distributed.rpc, TensorPipe "
          f"(transport {args.transport}, {args.rpc_threads} RPC threads), loopback port {port}; "
          f"caller -> trainer -> 1 PS (rpc_sync), mlp 64-32-10 b1, {args.seconds:g} s per "
          f"phase after {args.warmup:g} s warm-up, {os.cpu_count()} cpus", file=out, flush=True)
    children, lines = [], queue.Queue()
    try:
        for role in ROLES:
            children.append(subprocess.Popen(
                common + ["--role", role], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if role == "caller" else sys.stderr,
                start_new_session=True, preexec_fn=_die_with_parent, text=True))
        caller = children[-1]

        def read_caller():
            for line in caller.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=read_caller, daemon=True).start()
        deadline, done = time.monotonic() + args.timeout_s, None
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {args.timeout_s:g} s (--timeout-s)")
            for role, p in zip(ROLES, children):
                if p.poll() not in (None, 0):
                    raise RuntimeError(f"the {role} process {exit_text(p.returncode)}")
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith("PHASE "):
                ph = json.loads(line[6:])
                n, per_s, cpu_ms = ph["callers"], ph["per_s"], ph["cpu_ms"]
                result[f"{ph['kind']}_b1_c{n}_per_s"] = round(per_s, 1)
                result[f"cpu_ms_per_{ph['kind']}_c{n}"] = round(cpu_ms, 3)
                print(f"{ph['kind']:5s} b1, {n} caller(s): {per_s:9.1f} calls/s, trainer+PS CPU "
                      f"{cpu_ms:.3f} ms/{ph['kind']}", file=out, flush=True)
            elif line.startswith("DONE "):
                done = json.loads(line[5:])
            else:
                print(line, end="", file=sys.stderr, flush=True)
        caller.wait(max(1.0, deadline - time.monotonic()))
        for role, p in zip(ROLES, children):  # graceful rpc.shutdown everywhere
            rc = p.wait(max(1.0, min(30.0, deadline - time.monotonic())))
            if rc != 0:
                raise RuntimeError(f"the {role} process {exit_text(rc)}")
        if done is None:
            raise RuntimeError("the caller exited without its figures")
        # Every learn applies one update before it returns: nothing lost, nothing doubled.
        if done["ps_updates"] != done["learns"]:
            raise RuntimeError(f"the PS applied {done['ps_updates']} updates for "
                               f"{done['learns']} learns")
        result.update(learns=done["learns"], ps_updates=done["ps_updates"],
                      final_loss=round(done["final_loss"], 4))
        print(f"PS applied {done['ps_updates']} updates for {done['learns']} learns; "
              f"final loss {done['final_loss']:.4f}", file=out, flush=True)
        return result
    except subprocess.TimeoutExpired:
        raise RuntimeError("a process did not exit after rpc.shutdown")
    finally:
        stop_children(children)


def main():
    args = parse_args()
    if args.role:
        return run_role(args)
    torch, _ = import_torch()

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        result = launch(args, torch)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the three processes were stopped", file=sys.stderr)
        return 130
    except Exception as e:
        print(f"{PROG}: FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
