"""tests/hf_oracle_server.py on a command of its own (no torch, no transformers): a command handed
to the server prints and exits as it would have run in its caller's process, in the caller's
directory and environment; one killed by a signal says so; one whose caller goes away is
killed; without a server, or after `stop`, the caller runs the command itself; `start` replaces
a server already there."""
import os
import select
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_oracle_server  # noqa: E402

# The caller: hands its arguments to the server, or says it ran them itself.
CALLER = ("import sys; sys.path.insert(0, %r); import hf_oracle_server; "
          "hf_oracle_server.relay(sys.argv[1:]); print('ran here'); sys.exit(3)" % HERE)


def command(argv):
    """The server's commands: `echo OUT ERR STATUS`, `where` (directory and one variable),
    `segv`, and `block PID_FIFO`: writes its pid into the fifo, then waits for ever."""
    if argv[0] == "echo":
        print(argv[1])
        print(argv[2], file=sys.stderr)
        sys.exit(int(argv[3]))
    elif argv[0] == "where":
        print(os.getcwd(), os.environ.get("ORACLE_TEST_VALUE"))
    elif argv[0] == "segv":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    elif argv[0] == "block":
        with open(argv[1], "w") as f:
            f.write(str(os.getpid()))
        select.select([], [], [])
    else:
        raise KeyError(argv[0])


class OracleServer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pipetrain_oracle_")
        self.server = os.path.join(self.dir, "server")
        self.env = dict(os.environ, PIPETRAIN_HF_ORACLE=self.server)

    def tearDown(self):
        hf_oracle_server.stop(self.server)

    def call(self, *args, cwd=None, env=None):
        return subprocess.run([sys.executable, "-c", CALLER, *args], capture_output=True, text=True,
                              cwd=cwd, env=env or self.env, timeout=60)

    def test_a_command_prints_and_exits_as_in_its_callers_process(self):
        hf_oracle_server.start(command, self.server, lambda: None)
        self.assertEqual(os.stat(self.server).st_mode & 0o777, 0o700)
        r = self.call("echo", "to stdout", "to stderr", "5")
        self.assertEqual((r.stdout, r.stderr, r.returncode), ("to stdout\n", "to stderr\n", 5))
        r = self.call("echo", "fine", "", "0")
        self.assertEqual((r.stdout, r.returncode), ("fine\n", 0))
        r = self.call("where", cwd=self.dir, env=dict(self.env, ORACLE_TEST_VALUE="seen"))
        self.assertEqual(r.stdout, f"{self.dir} seen\n")
        r = self.call("segv")
        self.assertEqual(r.returncode, 128 + signal.SIGSEGV)
        r = self.call("unknown")  # the command's own failure: its traceback, status 1
        self.assertEqual(r.returncode, 1)
        self.assertIn("Traceback", r.stderr)

    def test_a_command_whose_caller_is_gone_is_killed(self):
        hf_oracle_server.start(command, self.server, lambda: None)
        fifo = os.path.join(self.dir, "pid")
        os.mkfifo(fifo)
        caller = subprocess.Popen([sys.executable, "-c", CALLER, "block", fifo], env=self.env)
        with open(fifo) as f:  # blocks until the command has started and written its pid
            pid = int(f.read())
        running = os.pidfd_open(pid)
        caller.kill()
        caller.wait(timeout=60)
        ready, _, _ = select.select([running], [], [], 60)
        self.assertEqual(ready, [running], "the command outlived its caller")

    def test_without_a_server_the_caller_runs_the_command(self):
        r = self.call("echo", "x", "y", "0")
        self.assertEqual((r.stdout, r.returncode), ("ran here\n", 3))
        r = self.call("echo", "x", "y", "0", env={k: v for k, v in self.env.items() if k != "PIPETRAIN_HF_ORACLE"})
        self.assertEqual((r.stdout, r.returncode), ("ran here\n", 3))
        hf_oracle_server.start(command, self.server, lambda: None)
        self.assertEqual(self.call("echo", "served", "", "0").stdout, "served\n")
        hf_oracle_server.stop(self.server)
        self.assertEqual(self.call("echo", "x", "y", "0").stdout, "ran here\n")

    def test_start_replaces_a_server_already_there(self):
        hf_oracle_server.start(command, self.server, lambda: None)
        hf_oracle_server.start(lambda argv: print("the new one"), self.server, lambda: None)
        self.assertEqual(self.call("echo", "x", "y", "0").stdout, "the new one\n")


if __name__ == "__main__":
    unittest.main()
