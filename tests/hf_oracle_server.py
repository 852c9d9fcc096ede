"""The oracle's server: tests/hf_models.py with its imports done once for a whole test run.

Each command of tests/hf_models.py starts Python, torch and transformers anew (about 4 s of
imports for a second of work). Where PIPETRAIN_HF_ORACLE names a directory in which a server
listens (ctest starts one before the tests that use the oracle and stops it after them: the
fixture `hf_oracle` of tests/CMakeLists.txt), hf_models.py hands its command to that server instead
of importing anything, and prints what it printed, with its exit status. The server forks a
copy of itself, imports done, for each command: each command runs in a fresh process as before
(its own patches, seeds and working directory), only its imports are shared. Where no server
answers, the command runs in its own process, as without one.

  hf_models.py start DIR   import, listen on DIR/oracle.sock (DIR made, mode 0700), detach
  hf_models.py stop DIR    stop the server listening there, if any

Every wait is bounded: a command runs at most COMMAND_LIMIT_S seconds, a server with no
command for IDLE_LIMIT_S seconds exits, and a command whose caller is gone is killed.
"""
import json
import os
import select
import signal
import socket
import sys
import tempfile
import traceback

IDLE_LIMIT_S = 900
COMMAND_LIMIT_S = 900
CONNECT_LIMIT_S = 10


def socket_path(directory):
    return os.path.join(directory, "oracle.sock")


def _read_all(conn):
    chunks = []
    while True:
        b = conn.recv(1 << 16)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _read_line(conn):
    """One request: a line of JSON (the caller keeps its end open: its closing means it is gone)."""
    chunks = []
    while not chunks or not chunks[-1].endswith(b"\n"):
        b = conn.recv(1 << 16)
        if not b:
            raise ConnectionError("the caller closed before its request's end")
        chunks.append(b)
    return b"".join(chunks)


def relay(argv):
    """Runs argv (hf_models.py's arguments) on the server named by PIPETRAIN_HF_ORACLE and exits
    with its status; returns where no server takes it (the command then runs here)."""
    directory = os.environ.get("PIPETRAIN_HF_ORACLE")
    if not directory:
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_LIMIT_S)
    try:
        conn.connect(socket_path(directory))
        conn.sendall(json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode() + b"\n")
        conn.settimeout(COMMAND_LIMIT_S + 60)
        reply = _read_all(conn)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
        return  # no server (or one stopping before it took the command): run here
    finally:
        conn.close()
    if not reply:
        return  # the server closed without taking the command
    header, _, body = reply.partition(b"\n")
    h = json.loads(header)
    sys.stdout.buffer.write(body[:h["out"]])
    sys.stdout.flush()
    sys.stderr.buffer.write(body[h["out"]:h["out"] + h["err"]])
    sys.stderr.flush()
    os._exit(h["status"])


def _run_command(main, request, out_file, err_file):
    """In the forked process that runs one command: the caller's directory, environment and
    threads, its output into the two files; never returns."""
    status = 1
    try:
        os.dup2(out_file.fileno(), 1)
        os.dup2(err_file.fileno(), 2)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in os.environ:  # read by OpenMP when it loaded, in the server: set it here
            import torch
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        main(request["argv"])
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _serve_one(main, conn):
    """In the forked process that answers one connection: runs its command in a child, waits for
    the child or the caller's going away (then kills the child), sends the output and status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    conn.settimeout(CONNECT_LIMIT_S)
    request = json.loads(_read_line(conn))
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run_command(main, request, out_file, err_file)
        pidfd = os.pidfd_open(pid)
        ready, _, _ = select.select([pidfd, conn], [], [], COMMAND_LIMIT_S)
        if pidfd not in ready:  # the caller went away (its end closed), or the command ran too long
            os.kill(pid, signal.SIGKILL)
        _, wait_status = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(wait_status)
        status = status if status >= 0 else 128 - status  # killed by a signal: as a shell says it
        if pidfd not in ready:
            err_file.write(f"hf_models.py: the oracle's command {request['argv']} ran past {COMMAND_LIMIT_S} s or lost its caller\n".encode())
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    conn.settimeout(COMMAND_LIMIT_S)
    conn.sendall(json.dumps({"status": status, "out": len(out), "err": len(err)}).encode() + b"\n" + out + err)
    conn.close()


def _serve(main, listener):
    """The server's loop: a forked process per connection; a "stop" request or IDLE_LIMIT_S
    seconds without one ends it."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forked processes are reaped as they end
    while True:
        ready, _, _ = select.select([listener], [], [], IDLE_LIMIT_S)
        if not ready:
            return
        conn, _ = listener.accept()
        conn.settimeout(CONNECT_LIMIT_S)
        try:
            first = conn.recv(1, socket.MSG_PEEK)
        except OSError:  # a caller that sent nothing
            conn.close()
            continue
        if first == b"s":  # "stop" (a request is JSON: it starts with "{")
            conn.close()
            return
        if os.fork() == 0:
            listener.close()
            try:
                _serve_one(main, conn)
            finally:
                os._exit(0)
        conn.close()


def stop(directory):
    """Stops the server listening in `directory`, if one does."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_LIMIT_S)
    try:
        conn.connect(socket_path(directory))
        conn.sendall(b"stop")
        print("stopped the oracle's server in", directory)
    except (FileNotFoundError, ConnectionRefusedError):
        print("no oracle's server in", directory)
    finally:
        conn.close()


def start(main, directory, warm):
    """Stops any server in `directory`, runs `warm` (imports), listens there and detaches; returns
    once it listens (the commands sent from then on are taken)."""
    stop(directory)
    path = socket_path(directory)
    if len(path.encode()) >= 100:  # sun_path's limit; without a server each command runs in its own process
        print("hf_models.py: no oracle's server: its socket's path is too long:", path)
        return
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    if os.path.exists(path):
        os.unlink(path)
    warm()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.flush()
    if os.fork() != 0:
        print("the oracle's server listens on", path)
        return
    os.setsid()  # detached: ctest's test that started it ends now, its output's pipe closed
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:  # the socket's file stays: a server started in its place has unlinked it and bound anew
        _serve(main, listener)
    finally:
        os._exit(0)
