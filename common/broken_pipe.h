// Writes to a peer that has gone must be errors, not deaths. Gloo writes to its sockets with
// writev(), which cannot ask the kernel to hold back SIGPIPE (only send() with MSG_NOSIGNAL can),
// so a rank writing to a pair whose other end just closed (a peer that failed, aborted or finished
// first) would be killed by SIGPIPE's default action before the write could return EPIPE and the
// transport could name the rank. Python ignores SIGPIPE at start, which is why the same libraries
// never show this under torch.distributed; a C++ program has to do it itself.
#pragma once

namespace pipetrain {

// Where SIGPIPE's disposition is the default (terminate), sets it to ignore, once per process;
// a handler or an ignore the program installed itself is left alone. Every transport, process
// group and store client calls this before it opens a socket (a program that never makes one
// keeps the default, so `pipetrain ... | head` still ends quietly). Returns whether SIGPIPE is
// now ignored or handled (false only if sigaction failed).
bool ignore_broken_pipe();

}  // namespace pipetrain
