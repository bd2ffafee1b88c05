"""A between-graph TensorFlow cluster of local processes, for tests.

    with LocalCluster(tmp_path, workers=1, ps=2, evaluator=True) as cluster:
      cluster.start_all_chief_first(
          lambda task: ["--model", "ctr", "--model-dir", model_dir, ...],
          chief_ready=lambda: os.path.exists(model_dir + "/checkpoint"))
      assert cluster.wait("chief:0", timeout=60) == 0

(`start_all` starts every task at once, the ps tasks first; a worker that
comes up before the chief has initialized the variables then waits TF's
30 s before it looks again.)

Every task is `python -m tests.cluster_programs <argv>` run from the
repository root with its own TF_CONFIG (ports on 127.0.0.1, found by binding
port 0). Tasks are named "<type>:<index>" ("chief:0", "worker:1", "ps:0",
"evaluator:0"); each run of a task writes stdout and stderr to
`<tmp_path>/logs/<type>_<index>.log`, a restart to `<type>_<index>.1.log`,
and so on. Leaving the `with` block kills every process the cluster started
(their whole process groups), whatever happened inside it.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = "tests.cluster_programs"

# Bounds, in seconds, for everything that waits.
DEFAULT_TIMEOUT = 90.0
POLL_SECS = 0.05
KILL_TIMEOUT = 10.0
MAX_TASK_SECONDS = 600.0
LOG_TAIL_CHARS = 4000


# The environment that makes a ps task log what it serves: TF's C++ log at
# INFO shows "Started server with target: grpc://..." and, from the
# rendezvous module's VLOG 1, one line per tensor it sends to another task
# ("BaseRemoteRendezvous Send ... /job:ps/...;...;/job:chief/..."). For
# `task_env={"ps": PS_SERVING_LOG_ENV}`; `ps_served(log)` reads it.
PS_SERVING_LOG_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "base_rendezvous_mgr=1",
}


def ps_served(log):
  """{job: number of tensors sent} a ps task's log (run with
  PS_SERVING_LOG_ENV) shows it sent to other jobs' tasks."""
  served = {}
  for line in log.splitlines():
    if "BaseRemoteRendezvous Send" not in line:
      continue
    # The rendezvous key: src_device;incarnation;dst_device;name;frame.
    fields = line.split("BaseRemoteRendezvous Send", 1)[1].split(";")
    if len(fields) < 3 or "/job:" not in fields[2]:
      continue
    job = fields[2].split("/job:", 1)[1].split("/", 1)[0]
    served[job] = served.get(job, 0) + 1
  return served


class ClusterTimeout(AssertionError):
  """A task did not get where it was awaited in time (the message has the
  tail of its log)."""


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1 (bound to port 0 and
  released; a port may in principle be taken again before the task binds
  it, which the task's log then shows)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(("127.0.0.1", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def parse_task(task):
  task_type, _, index = task.partition(":")
  if not task_type or not index.isdigit():
    raise ValueError(f"a task is named '<type>:<index>', got {task!r}")
  return task_type, int(index)


def tail(text, chars=LOG_TAIL_CHARS):
  return text if len(text) <= chars else "..." + text[-chars:]


def poll(predicate, timeout, what, on_timeout=None, interval=POLL_SECS):
  """Calls `predicate` until it returns a true value (returned), at most
  `timeout` seconds; then raises ClusterTimeout with `what` and
  `on_timeout()` (e.g. log tails)."""
  deadline = time.monotonic() + timeout
  while True:
    value = predicate()
    if value:
      return value
    if time.monotonic() >= deadline:
      extra = on_timeout() if on_timeout else ""
      raise ClusterTimeout(f"timed out after {timeout:.0f} s waiting for "
                           f"{what}{extra}")
    time.sleep(interval)


class LocalCluster:
  """A chief, `workers` workers, `ps` parameter servers and optionally an
  evaluator on 127.0.0.1.

  Args:
    tmp_path: a directory for the logs (`logs/` below it).
    chief: 1 (Estimator's clusters have exactly one chief) or 0.
    workers, ps: task counts.
    evaluator: whether an "evaluator:0" task exists (it is not in the
      cluster dict, as Estimator wants, only in its own TF_CONFIG task).
    env: extra environment variables for every task.
    task_env: {task type: extra environment variables} (after `env`), e.g.
      {"ps": PS_SERVING_LOG_ENV}.
    timeout: the default bound of `wait` and the other waiting methods.
    max_seconds: every task exits by itself after that long (and as soon
      as this process is gone), even if nothing kills it.
    program: the module every task runs (`python -m <program> <argv>`).
  """

  def __init__(self, tmp_path, chief=1, workers=1, ps=1, evaluator=False,
               env=None, task_env=None, timeout=DEFAULT_TIMEOUT,
               max_seconds=MAX_TASK_SECONDS, program=PROGRAM):
    if chief not in (0, 1):
      raise ValueError("a cluster has at most one chief")
    self.tmp_path = str(tmp_path)
    self.log_dir = os.path.join(self.tmp_path, "logs")
    os.makedirs(self.log_dir, exist_ok=True)
    self.program = program
    self.timeout = timeout
    self.max_seconds = max_seconds
    self._env = dict(env or {})
    self._task_env = {k: dict(v) for k, v in (task_env or {}).items()}
    counts = {"chief": chief, "worker": workers, "ps": ps}
    ports = iter(free_ports(sum(counts.values())))
    self.cluster = {
        job: [f"127.0.0.1:{next(ports)}" for _ in range(n)]
        for job, n in counts.items() if n
    }
    self.tasks = [f"{job}:{i}" for job in ("ps", "chief", "worker")
                  for i in range(counts[job])]
    if evaluator:
      self.tasks.append("evaluator:0")
    self._procs = {}     # task -> Popen of its current run
    self._started = []   # every Popen ever started, for __exit__
    self._argv = {}      # task -> argv of its last start
    self._runs = {}      # task -> number of starts
    self._logs = {}      # task -> log path of its current run

  # --- configuration -------------------------------------------------------

  def tf_config(self, task):
    task_type, index = parse_task(task)
    if task not in self.tasks:
      raise KeyError(f"no task {task!r} in this cluster ({self.tasks})")
    return {"cluster": self.cluster,
            "task": {"type": task_type, "index": index}}

  def training_tasks(self):
    """The chief and the workers, in the order of their input slices."""
    return [t for t in self.tasks if t.split(":")[0] in ("chief", "worker")]

  def address(self, task):
    task_type, index = parse_task(task)
    return self.cluster[task_type][index]

  # --- processes -----------------------------------------------------------

  def start(self, task, argv):
    """Starts `task` running `python -m <program> *argv`."""
    if task in self._procs and self._procs[task].poll() is None:
      raise RuntimeError(f"{task} is still running")
    run = self._runs.get(task, 0)
    task_type, index = parse_task(task)
    suffix = f".{run}" if run else ""
    log_path = os.path.join(self.log_dir, f"{task_type}_{index}{suffix}.log")
    env = dict(os.environ)
    env.update({
        "TF_CONFIG": json.dumps(self.tf_config(task)),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": REPO_ROOT,
        "PYTHONUNBUFFERED": "1",
        # The program's watchdog ends it when this process is gone.
        "CLUSTER_HARNESS_PARENT": str(os.getpid()),
        "CLUSTER_HARNESS_MAX_SECONDS": str(int(self.max_seconds)),
    })
    env.update(self._env)
    env.update(self._task_env.get(task_type, {}))
    argv = [str(a) for a in argv]
    with open(log_path, "wb") as log:
      proc = subprocess.Popen(
          [sys.executable, "-m", self.program] + argv, cwd=REPO_ROOT,
          env=env,
          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
          start_new_session=True)
    self._procs[task] = proc
    self._started.append(proc)
    self._argv[task] = argv
    self._runs[task] = run + 1
    self._logs[task] = log_path
    return proc

  def start_all(self, argv_for_task):
    """Starts every task (the ps tasks first) with `argv_for_task(task)`."""
    for task in self.tasks:
      self.start(task, argv_for_task(task))

  def start_all_chief_first(self, argv_for_task, chief_ready, timeout=None):
    """Starts the ps tasks, the chief and the evaluator; polls
    `chief_ready()` (at most `timeout` s, failing when the chief exits
    first); then starts the workers.

    A worker that finds the variables not yet initialized by the chief
    checks again only after TF's 30 s (SessionManager's recovery wait), so
    starting the workers once the chief has initialized them saves that.
    `chief_ready` can be `lambda: os.path.exists(model_dir + "/checkpoint")`
    (Estimator's chief saves step 0's checkpoint right after initializing),
    or a log line (`lambda: "HOLD" in cluster.log("chief:0")`).
    """
    timeout = self.timeout if timeout is None else timeout
    workers = [t for t in self.tasks if t.startswith("worker:")]
    for task in self.tasks:
      if task not in workers:
        self.start(task, argv_for_task(task))

    def ready():
      if chief_ready():
        return True
      if "chief:0" in self._procs and not self.running("chief:0"):
        raise ClusterTimeout(
            f"chief:0 exited (code {self.returncode('chief:0')}) before it "
            f"was ready{self.log_tails(first='chief:0')}")
      return False

    poll(ready, timeout, "the chief to be ready",
         lambda: self.log_tails(first="chief:0"))
    for task in workers:
      self.start(task, argv_for_task(task))

  def kill(self, task, timeout=KILL_TIMEOUT):
    """SIGKILLs `task` (its process group) and waits for it to be gone."""
    proc = self._procs[task]
    _kill_group(proc)
    try:
      proc.wait(timeout)
    except subprocess.TimeoutExpired as e:
      raise ClusterTimeout(f"{task} (pid {proc.pid}) survived SIGKILL for "
                           f"{timeout} s") from e
    return proc.returncode

  def restart(self, task):
    """Kills `task` if it runs and starts it again with the same argv (its
    log: the next `<type>_<i>.<n>.log`)."""
    if self.running(task):
      self.kill(task)
    return self.start(task, self._argv[task])

  def running(self, task):
    proc = self._procs.get(task)
    return proc is not None and proc.poll() is None

  def memory_mb(self, task, field="VmRSS"):
    """A running task's memory (`VmRSS`: now; `VmHWM`: its peak), in MB."""
    with open(f"/proc/{self._procs[task].pid}/status") as status:
      for line in status:
        if line.startswith(field + ":"):
          return int(line.split()[1]) / 1024
    raise KeyError(field)

  def returncode(self, task):
    return self._procs[task].poll()

  def wait(self, task, timeout=None):
    """The return code of `task`'s current run, waiting at most `timeout`
    seconds (default: the cluster's); raises ClusterTimeout with the tail of
    its log (and of every other task's) when it is still running then."""
    timeout = self.timeout if timeout is None else timeout
    try:
      return self._procs[task].wait(timeout)
    except subprocess.TimeoutExpired:
      raise ClusterTimeout(f"{task} still running after {timeout:.0f} s"
                           f"{self.log_tails(first=task)}") from None

  def wait_for_log(self, task, text, timeout=None):
    """Waits until `task`'s current log contains `text` (fails at once when
    the task has exited without it)."""
    timeout = self.timeout if timeout is None else timeout

    def seen():
      if text in self.log(task):
        return True
      if not self.running(task) and text not in self.log(task):
        raise ClusterTimeout(
            f"{task} exited (code {self.returncode(task)}) without logging "
            f"{text!r}{self.log_tails(first=task)}")
      return False

    return poll(seen, timeout, f"{task} to log {text!r}",
                lambda: self.log_tails(first=task))

  def wait_for_path(self, path, timeout=None):
    timeout = self.timeout if timeout is None else timeout
    return poll(lambda: os.path.exists(path), timeout, f"{path} to exist",
                self.log_tails)

  # --- logs ----------------------------------------------------------------

  def log_path(self, task, run=None):
    """The log of `task`'s current run, or of its run number `run` (0 is
    the first start)."""
    if run is None:
      return self._logs[task]
    task_type, index = parse_task(task)
    suffix = f".{run}" if run else ""
    return os.path.join(self.log_dir, f"{task_type}_{index}{suffix}.log")

  def log(self, task, run=None):
    path = self.log_path(task, run)
    try:
      with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
      return ""

  def log_tails(self, first=None, chars=1500):
    """The tails of every started task's current log (`first` first)."""
    order = sorted(self._logs, key=lambda t: t != first)
    parts = []
    for task in order:
      state = ("running" if self.running(task)
               else f"exit {self.returncode(task)}")
      parts.append(f"\n----- {task} ({state}): {self._logs[task]}\n"
                   f"{tail(self.log(task), chars if task != first else LOG_TAIL_CHARS)}")
    return "".join(parts)

  # --- context manager -----------------------------------------------------

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()
    return False

  def close(self):
    """Kills every process this cluster started (and their groups)."""
    for proc in self._started:
      _kill_group(proc)
    for proc in self._started:
      try:
        proc.wait(KILL_TIMEOUT)
      except subprocess.TimeoutExpired:
        pass


def _kill_group(proc):
  # Each task leads its own session (start_new_session): its group id is its
  # pid, which stays reserved until the leader is reaped (a zombie holds
  # it). So the group is killed only while the leader is not reaped yet:
  # a reaped leader's pid may belong to someone else by now.
  if proc.returncode is not None:
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  try:
    proc.kill()
  except ProcessLookupError:
    pass
