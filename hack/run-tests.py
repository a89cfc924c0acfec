#!/usr/bin/env python3
"""Builds pgop's test binaries once and runs them, several at a time.

    hack/run-tests.py [--jobs N] [cargo test build arguments] [-- test binary arguments]

`cargo test` runs one test binary after the other. Most of pgop's tests spend their time
waiting on PostgreSQL, the API server, kubelets and timers, so on these 2-core machines one
binary leaves a core idle. This runs up to N test processes at once (each still running its
own tests two at a time, as libtest does), longest first, so the suite ends sooner.

Each crate's integration tests are one binary, `tests/it/main.rs`, with a module per
subject (one link of the dependency tree instead of one per file). Such a binary is run as
one process per module (`it --exact MODULE::test ...`, the names from `it --list`), so a
module keeps a process of its own, as when each was a binary: its own control plane, nodes
and directories (the tests never share process-global state), and running modules side
by side changes only the load. Unit-test binaries run whole. The real-node modules run one
at a time (beside the others), their load being the heaviest, and first: their chain is the
longest path of a run.

A process's output is printed whole when it ends, headed by cargo's own
"     Running <source> (<binary>)" line, and the failures are listed at the end in
cargo's words (`error: N targets failed:` and one `-p <package> --test <name>` each, with
`-- MODULE::` for a module), so logs read as they do under `cargo test --no-fail-fast`.
Every process runs, whatever the others do. The exit status is 101 when one failed, as
cargo's. Test name filters after `--` select tests as libtest would (substring, or whole
names with `--exact`), and a module with no test selected is not started.

Durations of the last run (per unit-test binary, per module of an `it` binary) are kept in
~/.cache/pgop/test-durations.tsv (outside the checkout) and order the next run;
hack/test-durations.tsv, committed, orders a first run.
PGOP_TEST_JOBS sets N (default 3: at two, the machine was busy 75% of the time on
average). A real-node module takes two of the N: beside it runs one process fewer.
While the machine idles, one process more may run: when it was less than IDLE_BUSY busy
over the last IDLE_WINDOW seconds and nothing started in that time (the real-node modules
spend most of their time waiting for failovers and timers: a cold run measured the
machine 35-70% busy during them). PGOP_TEST_EXTRA=0 turns that off.
A few tools only a few modules use (LATE_TOOLS: promtool, bundle-validate, otlp-check,
krew) are not installed before the tests start (hack/test.sh installs the rest first): a
module whose sources name one's installer (`hack/install-NAME.sh`, as a test that needs a
missing binary names its install command) waits for it, and this installs the ones the
selected modules need, one after the other, in the background at the lowest CPU priority
(nice 19), so that on a machine without them they are built in the time the tests leave
the cores idle instead of before the first test. Installed, each installer is a no-op.
Doc tests run last, through cargo.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("PGOP_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pgop"))
SEEN = os.path.join(CACHE, "test-durations.tsv")
COMMITTED = os.path.join(ROOT, "hack", "test-durations.tsv")


def read_durations(path):
    durations = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#"):
                    try:
                        durations[parts[1]] = float(parts[0])
                    except ValueError:
                        pass
    except OSError:
        pass
    return durations


def machine_busy():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


# One process more than N may run while the machine was less busy than this (a fraction)
# over the last IDLE_WINDOW seconds, and nothing started during them.
IDLE_BUSY = 0.6
IDLE_WINDOW = 20.0


class Load:
    """The machine's busy fraction over the last IDLE_WINDOW seconds, from /proc/stat
    samples taken every 2 s by a thread of its own."""

    def __init__(self):
        self.samples = []
        self.lock = threading.Lock()

    def sample_forever(self, stop):
        while not stop.is_set():
            busy, total = machine_busy()
            now = time.monotonic()
            with self.lock:
                self.samples.append((now, busy, total))
                while len(self.samples) > 2 and self.samples[1][0] <= now - IDLE_WINDOW:
                    self.samples.pop(0)
            stop.wait(2.0)

    def recent(self):
        """(busy fraction, seconds covered) over the window; (1.0, 0) before two samples."""
        with self.lock:
            if len(self.samples) < 2:
                return 1.0, 0.0
            (t0, b0, s0), (t1, b1, s1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / max(1, s1 - s0), t1 - t0


# The tools hack/test.sh leaves to this script (see the docstring), cheapest build first:
# otlp-check and krew build in under half a minute from nothing, bundle-validate in about a
# minute, promtool in four (docs/testenv.md).
LATE_TOOLS = ("otlp-check", "krew", "bundle-validate", "promtool")


def late_tools_of(directory, source):
    """The late tools a module needs: those whose installer its sources name. `source` is
    the module's path without `.rs`, relative to its package's directory; its sources are
    that file, or every file under that directory (`MODULE/mod.rs` and its children)."""
    path = os.path.join(directory, source)
    files = [path + ".rs"] if os.path.isfile(path + ".rs") else []
    if os.path.isdir(path):
        for parent, _, names in os.walk(path):
            files += [os.path.join(parent, n) for n in sorted(names) if n.endswith(".rs")]
    needed = set()
    for name in files:
        with open(name, encoding="utf-8", errors="replace") as f:
            text = f.read()
        needed.update(t for t in LATE_TOOLS if f"hack/install-{t}.sh" in text)
    return needed


class LateTools:
    """Installs the late tools the selected modules need, one after the other, in a thread
    of its own, each installer at nice 19, and tells which are there."""

    def __init__(self, tools, log_dir):
        self.tools = [t for t in LATE_TOOLS if t in tools]
        self.state = {t: "pending" for t in self.tools}
        self.logs = {t: os.path.join(log_dir, f"install-{t}.log") for t in self.tools}
        self.lock = threading.Lock()
        self.process = None

    def status(self, tools):
        """"ready", "pending" or "failed" for a module needing `tools`."""
        with self.lock:
            states = [self.state.get(t, "ready") for t in tools]
        if "failed" in states:
            return "failed"
        return "pending" if "pending" in states else "ready"

    def failure(self, tools):
        """What to print for a module whose tool failed to install: each log's end."""
        text = ""
        for t in tools:
            if self.state.get(t) != "failed":
                continue
            try:
                with open(self.logs[t], encoding="utf-8", errors="replace") as f:
                    tail = f.read()[-4000:]
            except OSError as error:
                tail = f"(no log: {error})\n"
            text += (f"hack/install-{t}.sh failed (log {self.logs[t]}), so this module did "
                     f"not run; its log ends:\n{tail}\n")
        return text

    def install(self, stop):
        for tool in self.tools:
            if stop.is_set():
                return
            t0 = time.monotonic()
            with open(self.logs[tool], "w", encoding="utf-8") as log:
                with self.lock:
                    self.process = subprocess.Popen(
                        ["nice", "-n", "19", os.path.join(ROOT, "hack", f"install-{tool}.sh")],
                        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                status = self.process.wait()
            with self.lock:
                self.process = None
                self.state[tool] = "ready" if status == 0 else "failed"
            word = "done" if status == 0 else f"failed (exit {status})"
            print(f"[run-tests] hack/install-{tool}.sh {word} in {time.monotonic() - t0:.0f} s "
                  f"(log {self.logs[tool]})", flush=True)

    def kill(self):
        with self.lock:
            if self.process is not None:
                try:
                    os.killpg(self.process.pid, signal.SIGTERM)
                except OSError:
                    pass


def split_args(argv):
    jobs = int(os.environ.get("PGOP_TEST_JOBS", "3"))
    extra = int(os.environ.get("PGOP_TEST_EXTRA", "1"))
    cargo, binary = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            binary = argv[i + 1 :]
            break
        if arg == "--jobs" and i + 1 < len(argv):
            jobs = int(argv[i + 1])
            i += 2
            continue
        if arg.startswith("--jobs="):
            jobs = int(arg.split("=", 1)[1])
        elif arg != "--no-fail-fast":
            cargo.append(arg)
        i += 1
    if jobs < 1:
        sys.exit("--jobs must be at least 1")
    if extra < 0:
        sys.exit("PGOP_TEST_EXTRA must be 0 or more")
    return jobs, extra, cargo, binary


# libtest's options that take a value: what follows them is not a test name filter.
VALUED = {"--test-threads", "--skip", "--format", "--color", "--logfile", "-Z", "--shuffle-seed"}


def filters_of(binary_args):
    """The test name filters among the binary arguments, and the arguments without them."""
    filters, rest = [], []
    i = 0
    while i < len(binary_args):
        arg = binary_args[i]
        if arg in VALUED and i + 1 < len(binary_args):
            rest += [arg, binary_args[i + 1]]
            i += 2
            continue
        if arg.startswith("-"):
            rest.append(arg)
        else:
            filters.append(arg)
        i += 1
    return filters, rest


def modules(entry, binary_args):
    """An `it` binary as one entry per module: [(package, kind, module, source, executable,
    dir, [test names])], with the tests the filters select."""
    package, kind, name, source, executable, directory = entry
    filters, _ = filters_of(binary_args)
    exact = "--exact" in binary_args
    listed = subprocess.run([executable, "--list", "--format", "terse"], cwd=directory,
                            env=dict(os.environ, CARGO_MANIFEST_DIR=directory),
                            stdout=subprocess.PIPE, text=True, check=True).stdout
    by_module = {}
    for line in listed.splitlines():
        if not line.endswith(": test"):
            continue
        test = line[: -len(": test")]
        if filters and not any((test == f) if exact else (f in test) for f in filters):
            continue
        module = test.split("::", 1)[0] if "::" in test else ""
        by_module.setdefault(module, []).append(test)
    source_dir = os.path.dirname(source)
    return [(package, kind, module or name, os.path.join(source_dir, module or "main"),
             executable, directory, tests)
            for module, tests in sorted(by_module.items())]


def build(cargo_args):
    """Builds every test binary; returns [(package, kind, name, source, executable, dir)]."""
    command = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics"] + cargo_args
    if not any(a in ("-p", "--package", "--workspace") or a.startswith("--package=") for a in cargo_args):
        command.insert(2, "--workspace")
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in process.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        package = message["package_id"]
        # package_id: "path+file:///.../crates/instance#pgop-instance@0.1.0", or
        # "path+file:///.../crates/pgop#0.1.0" when the name is the directory's.
        if "#" in package:
            url, fragment = package.split("#", 1)
            name = fragment.split("@", 1)[0] if "@" in fragment else url.rstrip("/").rsplit("/", 1)[-1]
        else:
            name = package.split()[0]
        kind = target["kind"][0]
        source = os.path.relpath(target["src_path"], os.path.dirname(message["manifest_path"]))
        binaries.append((name, kind, target["name"], source, message["executable"],
                         os.path.dirname(message["manifest_path"])))
    if process.wait() != 0:
        sys.exit(process.returncode)
    return binaries


def group(name):
    """Binaries that must not run beside each other: the real-node tier's (each runs
    containerd, kubelets and several PostgreSQL servers; two of them at once saturate both
    cores, and then Lease renewals miss and failovers happen that the tests do not expect)."""
    if name.startswith("e2e_real_") or name == "real_nodes":
        return "real-nodes"
    return None


def rerun_hint(package, kind, name, split=False):
    if kind == "test" and split:
        return f"-p {package} --test it -- {name}::"
    if kind == "test":
        return f"-p {package} --test {name}"
    if kind == "bin":
        return f"-p {package} --bin {name}"
    return f"-p {package} --lib"


def main():
    jobs, extra, cargo_args, binary_args = split_args(sys.argv[1:])
    started = time.monotonic()
    binaries = build(cargo_args)
    built = time.monotonic() - started
    entries = []
    for b in binaries:
        if b[1] == "test" and b[2] == "it":
            entries += modules(b, binary_args)
        else:
            entries.append(b + (None,))
    key = lambda b: f"{b[0]}/{b[2]}"
    more = " (one more while the machine idles)" if extra else ""
    print(f"[run-tests] built {len(binaries)} test binaries in {built:.0f} s; running "
          f"{len(entries)} test processes, {jobs} at a time{more}", flush=True)

    # The late tools each module needs (a unit-test binary none), and their installer.
    needs = {}
    for e in entries:
        needs[key(e)] = late_tools_of(e[5], e[3]) if e[6] is not None else set()
    wanted = set().union(*needs.values()) if needs else set()
    late = LateTools(wanted, tempfile.mkdtemp(prefix="pgop-late-tools.") if wanted else "")
    if late.tools:
        print(f"[run-tests] installing {', '.join(late.tools)} in the background (nice 19) for "
              f"the modules that need them; they start once theirs is there", flush=True)

    durations = read_durations(COMMITTED)
    durations.update(read_durations(SEEN))
    # The real-node modules first (they run one after the other, and their chain is the
    # longest path of the run: started last, the short ones ran alone at the end with the
    # machine a third busy), then the others longest first, so that the long ones start
    # while there is still short work to fill the gaps.
    pending = sorted(entries, key=lambda b: (group(b[2]) is None, -durations.get(key(b), 30.0)))

    lock = threading.Lock()
    failed, measured = [], {}
    running = {}
    stop = threading.Event()

    def run(entry):
        package, kind, name, source, executable, directory, tests = entry
        if late.status(needs[key(entry)]) == "failed":
            with lock:
                sys.stdout.write(f"     Running {source} ({executable})\n")
                sys.stdout.write(late.failure(needs[key(entry)]))
                hint = rerun_hint(package, kind, name, tests is not None)
                sys.stdout.write(f"error: test failed, to rerun pass `{hint}`\n\n")
                failed.append(hint)
                sys.stdout.flush()
            return
        if tests is None:
            argv = [executable] + binary_args
        else:
            flags = [a for a in filters_of(binary_args)[1] if a != "--exact"]
            argv = [executable, "--exact"] + tests + flags
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as out:
            env = dict(os.environ, CARGO_MANIFEST_DIR=directory, CARGO_PKG_NAME=package)
            t0 = time.monotonic()
            busy0, total0 = machine_busy()
            process = subprocess.Popen(argv, cwd=directory, env=env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            with lock:
                running[process.pid] = process
            status = process.wait()
            with lock:
                running.pop(process.pid, None)
            elapsed = time.monotonic() - t0
            busy1, total1 = machine_busy()
            out.seek(0)
            text = out.read()
        load = 100.0 * (busy1 - busy0) / max(1, total1 - total0)
        with lock:
            sys.stdout.write(f"     Running {source} ({executable})\n")
            sys.stdout.write(text)
            if status != 0:
                hint = rerun_hint(package, kind, name, tests is not None)
                sys.stdout.write(f"error: test failed, to rerun pass `{hint}`\n")
                failed.append(hint)
            sys.stdout.write(f"[run-tests] {package}/{name}: {elapsed:.1f} s, exit {status}, "
                             f"machine busy {load:.0f}%, {time.monotonic() - started:.0f} s since start\n\n")
            sys.stdout.flush()
            measured[key(entry)] = elapsed

    busy_groups = set()
    free = threading.Condition(lock)
    used = [0]

    def weight(entry):
        # A real-node module takes two of the slots: beside it runs one process fewer.
        return min(jobs, 2) if group(entry[2]) is not None else 1

    machine = Load()
    last_start = [time.monotonic()]
    extras = [0]

    def may_start(entry):
        """0: not now; 1: in the N slots; 2: as the one more an idle machine takes."""
        tools = late.status(needs[key(entry)])
        if tools == "failed":
            return 1  # reported at once, without running
        if tools == "pending":
            return 0
        kind = group(entry[2])
        if kind is not None and kind in busy_groups:
            return 0
        if used[0] + weight(entry) <= jobs:
            return 1
        if kind is None and used[0] + 1 <= jobs + extra:
            busy, covered = machine.recent()
            quiet = time.monotonic() - last_start[0] >= IDLE_WINDOW
            if quiet and covered >= IDLE_WINDOW - 2.5 and busy < IDLE_BUSY:
                return 2
        return 0

    def worker():
        while not stop.is_set():
            with lock:
                while True:
                    if not pending:
                        return
                    # The longest that may run now: none of its group is running, and it
                    # fits in the slots left. A real-node module whose group is free but
                    # which does not fit yet waits for slots, and nothing after it starts
                    # meanwhile: else the shorter modules, started one after the other in
                    # the slot it needs, would hold it back until they were all done (a run
                    # left the last real-node modules alone at the end, the machine 15-20%
                    # busy).
                    index, how = None, 0
                    for i, e in enumerate(pending):
                        how = may_start(e)
                        if how:
                            index = i
                            break
                        if group(e[2]) is not None and group(e[2]) not in busy_groups:
                            break
                    if index is not None:
                        break
                    free.wait(1.0)
                    if stop.is_set():
                        return
                entry = pending.pop(index)
                kind = group(entry[2])
                if kind is not None:
                    busy_groups.add(kind)
                used[0] += weight(entry)
                last_start[0] = time.monotonic()
                if how == 2:
                    extras[0] += 1
            try:
                run(entry)
            finally:
                with lock:
                    if kind is not None:
                        busy_groups.discard(kind)
                    used[0] -= weight(entry)
                    free.notify_all()

    def interrupted(signum, _frame):
        stop.set()
        late.kill()
        with lock:
            for process in running.values():
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except OSError:
                    pass
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    threading.Thread(target=machine.sample_forever, args=(stop,), daemon=True).start()
    threading.Thread(target=late.install, args=(stop,), daemon=True).start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(jobs + extra)]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(1.0)

    # Doc tests: cargo builds and runs them (the --no-run build above does not).
    # Only for a whole-package selection: cargo refuses --doc beside --test, --lib, ...
    selectors = ("--test", "--tests", "--lib", "--bin", "--bins", "--example", "--examples",
                 "--bench", "--benches", "--all-targets")
    # And only where there is a library: `cargo test --doc -p pgop` fails ("no library
    # targets found") for a package of binaries alone.
    libraries = any(b[1] == "lib" for b in binaries)
    if libraries and not any(a.split("=", 1)[0] in selectors for a in cargo_args):
        scope = [] if any(a in ("-p", "--package") for a in cargo_args) else ["--workspace"]
        print("     Running doc tests (cargo test --doc)", flush=True)
        doc = subprocess.run(["cargo", "test", "--doc"] + scope + cargo_args + ["--"] + binary_args,
                             cwd=ROOT)
        if doc.returncode != 0:
            failed.append("--doc")

    all_durations = read_durations(SEEN)
    all_durations.update(measured)
    try:
        os.makedirs(CACHE, exist_ok=True)
        with open(SEEN + ".part", "w", encoding="utf-8") as f:
            for name, seconds in sorted(all_durations.items(), key=lambda kv: -kv[1]):
                f.write(f"{seconds:.0f}\t{name}\n")
        os.replace(SEEN + ".part", SEEN)
    except OSError as error:
        print(f"[run-tests] could not record durations in {SEEN}: {error}", file=sys.stderr)

    print(f"[run-tests] {len(entries)} test processes in {time.monotonic() - started:.0f} s "
          f"({jobs} at a time, {extras[0]} started as one more while the machine idled)",
          flush=True)
    if failed:
        print(f"error: {len(failed)} target{'s' if len(failed) > 1 else ''} failed:")
        for hint in failed:
            print(f"    `{hint}`")
        sys.exit(101)


if __name__ == "__main__":
    main()
