#include "core/stack_signature.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace endure::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}
std::string ShortHex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// What differs between two ranks stuck in the same code: where the process
// and its libraries were mapped, thread ids and LWPs, argument values, the
// number of idle pool threads and the order gdb lists the threads in.
struct RankProcess {
  uint64_t base = 0x7f3b2a400000;  // libc and friends
  uint64_t heap = 0x55d0c8a00000;  // the executable and its heap
  int lwp = 12345;
  int step = 41;
  int pool_threads = 2;      // idle OpenMP workers
  bool reversed = false;     // gdb's order of the background threads
  bool hung = false;         // in the injected hang instead of the allreduce
  int allreduce_line = 212;  // a rebuilt trainer moves code around
};

std::string ThreadHeader(int number, const RankProcess& p, int offset, const char* name) {
  return "Thread " + std::to_string(number) + " (Thread " + ShortHex(p.base - 0x1000000 * offset) +
         " (LWP " + std::to_string(p.lwp + offset) + ") \"" + name + "\"):\n";
}

// Frames #0-#4 of a thread blocked on a condition variable (glibc 2.36).
std::string CondWaitFrames(const RankProcess& p, uint64_t cv) {
  const std::string word = Hex(cv + 40);
  return "#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, "
         "expected=0, futex_word=" +
         word +
         ") at ./nptl/futex-internal.c:57\n"
         "#1  __futex_abstimed_wait_common (futex_word=futex_word@entry=" +
         word +
         ", expected=expected@entry=0, clockid=clockid@entry=0, abstime=abstime@entry=0x0, "
         "private=private@entry=0, cancel=cancel@entry=true) at ./nptl/futex-internal.c:87\n"
         "#2  " +
         Hex(p.base + 0xa3f7b) + " in __GI___futex_abstimed_wait_cancelable64 (futex_word=" + word +
         ", expected=0, clockid=0, abstime=0x0, private=0) at ./nptl/futex-internal.c:139\n"
         "#3  " +
         Hex(p.base + 0xa65d8) +
         " in __pthread_cond_wait_common (abstime=0x0, clockid=0, mutex=" + Hex(cv - 64) +
         ", cond=" + Hex(cv) +
         ") at ./nptl/pthread_cond_wait.c:503\n"
         "#4  ___pthread_cond_wait (cond=" +
         Hex(cv) + ", mutex=" + Hex(cv - 64) + ") at ./nptl/pthread_cond_wait.c:618\n";
}

std::string MainThread(const RankProcess& p) {
  std::string s = ThreadHeader(1, p, 0, "trainer");
  if (p.hung) {
    s += "#0  " + Hex(p.base + 0xed545) +
         " in __GI___clock_nanosleep (clock_id=clock_id@entry=0, flags=flags@entry=0, req=" +
         Hex(0x7ffd68c628c0) + ", rem=" + Hex(0x7ffd68c628c0) +
         ") at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48\n"
         "#1  " +
         Hex(p.base + 0xf1e53) +
         " in __GI___nanosleep (req=<optimized out>, rem=<optimized out>) at "
         "../sysdeps/unix/sysv/linux/nanosleep.c:25\n"
         "#2  " +
         Hex(p.heap + 0x1a6c) +
         " in std::this_thread::sleep_for<long, std::ratio<1l, 1l> > (__rtime=...) at "
         "/usr/include/c++/12/bits/this_thread_sleep.h:80\n"
         "#3  endure::Session::Impl::FireFaults (this=" +
         Hex(p.heap + 0x5e2a0) + ", step=" + std::to_string(p.step) +
         ") at /work/main/src/client/client.cc:603\n"
         "#4  " +
         Hex(p.heap + 0x2b17) + " in endure::Session::BeginStep (this=" + Hex(0x7ffd68c62a10) +
         ", step_index=" + std::to_string(p.step) +
         ") at /work/main/src/client/client.cc:540\n"
         "#5  " +
         Hex(p.heap + 0x4410) +
         " in endure::trainer::RunTraining (options=..., session=" + Hex(0x7ffd68c62a10) +
         ") at /work/main/src/trainer/train.cc:371\n";
  } else {
    s += CondWaitFrames(p, p.heap + 0x7120) + "#5  " + Hex(p.base + 0x2d44a3) +
         " in std::condition_variable::wait(std::unique_lock<std::mutex>&) () from "
         "/lib/x86_64-linux-gnu/libstdc++.so.6\n"
         "#6  " +
         Hex(p.base + 0x9c0e21) +
         " in c10d::ProcessGroupGloo::AsyncWork::wait(std::chrono::duration<long, "
         "std::ratio<1l, 1000l> >) () from /opt/libtorch/lib/libtorch_cpu.so\n"
         "#7  " +
         Hex(p.heap + 0x3f20) + " in endure::trainer::Allreduce (group=..., grads=std::vector of " +
         "length 12, capacity 12 = {...}, step=" + std::to_string(p.step) +
         ") at /work/main/src/trainer/train.cc:" + std::to_string(p.allreduce_line) +
         "\n"
         "#8  " +
         Hex(p.heap + 0x4410) +
         " in endure::trainer::RunTraining (options=..., session=" + Hex(0x7ffd68c62a10) +
         ") at /work/main/src/trainer/train.cc:388\n";
  }
  s += "#9  " + Hex(p.heap + 0x1379) + " in main (argc=7, argv=" + Hex(0x7ffd68c62a68) +
       ") at /work/main/src/trainer/main.cc:64\n";
  return s;
}

std::string ThreadStart(const RankProcess& p, int first) {
  return "#" + std::to_string(first) + "  " + Hex(p.base + 0x2d44a3) +
         " in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6\n"
         "#" +
         std::to_string(first + 1) + "  " + Hex(p.base + 0xa71f5) +
         " in start_thread (arg=<optimized out>) at ./nptl/pthread_create.c:442\n"
         "#" +
         std::to_string(first + 2) + "  " + Hex(p.base + 0x1278ec) +
         " in clone3 () at ../sysdeps/unix/sysv/linux/x86_64/clone3.S:81\n";
}

// The agent's text for one rank: gdb's "thread apply all bt" with the main
// thread first (src/agent/worker_set.cc).
std::string GdbDump(const RankProcess& p) {
  std::vector<std::string> others;
  int n = 2;
  // Gloo's worker: in the allreduce, or (on the hung rank, which never got
  // there) waiting for work.
  std::string gloo = ThreadHeader(n, p, n, "trainer") + CondWaitFrames(p, p.heap + 0x9a00) +
                     "#5  " + Hex(p.base + 0x2d44a3) +
                     " in std::condition_variable::wait(std::unique_lock<std::mutex>&) () from "
                     "/lib/x86_64-linux-gnu/libstdc++.so.6\n";
  if (!p.hung) {
    gloo += "#6  " + Hex(p.base + 0x9b1234) +
            " in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, "
            "std::ratio<1l, 1000l> >) () from /opt/libtorch/lib/libtorch_cpu.so\n"
            "#7  " +
            Hex(p.base + 0x9a0000) +
            " in gloo::allreduce(gloo::AllreduceOptions const&) () from "
            "/opt/libtorch/lib/libtorch_cpu.so\n";
  }
  gloo += "#8  " + Hex(p.base + 0x9c2000) +
          " in c10d::ProcessGroupGloo::runLoop(int) () from /opt/libtorch/lib/libtorch_cpu.so\n" +
          ThreadStart(p, 9);
  others.push_back(gloo);
  ++n;
  // Gloo's event loop.
  others.push_back(ThreadHeader(n, p, n, "trainer") + "#0  " + Hex(p.base + 0x12746e) +
                   " in epoll_wait (epfd=" + std::to_string(5 + p.lwp % 3) +
                   ", events=" + Hex(p.base - 0x2000) +
                   ", maxevents=64, timeout=-1) at ../sysdeps/unix/sysv/linux/epoll_wait.c:30\n"
                   "#1  " +
                   Hex(p.base + 0x9d0000) +
                   " in gloo::transport::tcp::Loop::run() () from "
                   "/opt/libtorch/lib/libtorch_cpu.so\n" +
                   ThreadStart(p, 2));
  ++n;
  // The endure client's heartbeat: asleep between beats, on every rank.
  others.push_back(ThreadHeader(n, p, n, "trainer") + "#0  " + Hex(p.base + 0xed545) +
                   " in __GI___clock_nanosleep (clock_id=clock_id@entry=0, flags=flags@entry=0, "
                   "req=" +
                   Hex(p.base - 0x3000) + ", rem=" + Hex(p.base - 0x3000) +
                   ") at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48\n"
                   "#1  " +
                   Hex(p.base + 0xf1e53) +
                   " in __GI___nanosleep (req=<optimized out>, rem=<optimized out>) at "
                   "../sysdeps/unix/sysv/linux/nanosleep.c:25\n"
                   "#2  " +
                   Hex(p.heap + 0x5a6c) +
                   " in std::this_thread::sleep_for<long, std::ratio<1l, 1000l> > (__rtime=...) "
                   "at /usr/include/c++/12/bits/this_thread_sleep.h:80\n"
                   "#3  " +
                   Hex(p.heap + 0x6000) +
                   " in endure::Session::Impl::HeartbeatLoop (this=" + Hex(p.heap + 0x5e2a0) +
                   ") at /work/main/src/client/client.cc:210\n" + ThreadStart(p, 4));
  ++n;
  // Idle OpenMP workers, as many as the node's cores allow.
  for (int i = 0; i < p.pool_threads; ++i, ++n) {
    others.push_back(ThreadHeader(n, p, n, "trainer") + "#0  " + Hex(p.base + 0xe8f0) +
                     " in do_futex_wait (...) from /lib/x86_64-linux-gnu/libgomp.so.1\n"
                     "#1  " +
                     Hex(p.base + 0xe9a0) +
                     " in gomp_team_barrier_wait_end () from /lib/x86_64-linux-gnu/libgomp.so.1\n"
                     "#2  " +
                     Hex(p.base + 0xeab0) +
                     " in ?? () from /lib/x86_64-linux-gnu/libgomp.so.1\n"
                     "#3  " +
                     Hex(p.base + 0xeac0) + " in ?? () from /lib/x86_64-linux-gnu/libgomp.so.1\n" +
                     ThreadStart(p, 4));
  }
  if (p.reversed) std::reverse(others.begin(), others.end());
  std::string dump = MainThread(p);
  for (const std::string& t : others) dump += t;
  return dump;
}

// Four ranks of a C++ trainer on two nodes; rank 1 is in the injected hang.
std::vector<std::pair<Rank, std::string>> FourGdbRanks() {
  RankProcess r0;
  RankProcess r1{.base = 0x7f0011200000, .heap = 0x5611aa000000, .lwp = 2201, .hung = true};
  RankProcess r2{.base = 0x7fa0b3000000,
                 .heap = 0x5599c1000000,
                 .lwp = 30817,
                 .pool_threads = 5,
                 .reversed = true};
  RankProcess r3{.base = 0x7fe9d0a00000,
                 .heap = 0x55aa10000000,
                 .lwp = 30818,
                 .step = 40,
                 .pool_threads = 1,
                 .allreduce_line = 219};
  return {{Rank{0}, GdbDump(r0)},
          {Rank{1}, GdbDump(r1)},
          {Rank{2}, "rank 2:\n" + GdbDump(r2)},
          {Rank{3}, GdbDump(r3)}};
}

// faulthandler's dump of a Python trainer (python/endure registers it on a
// signal): the newest thread first, the main thread last. `site` is where
// the node installed its packages.
struct PythonRank {
  std::string site = "/opt/venv/lib/python3.11/site-packages";
  std::string stdlib = "/usr/lib/python3.11";
  uint64_t tid = 0x00007f8e4b7fe640;
  int loader_threads = 1;  // pin-memory threads, one per data loader
  bool hung = false;       // stuck in the injected hang
  bool sleeping = false;   // stuck in a time.sleep() of the user's
};

std::string PythonDump(const PythonRank& p) {
  auto thread = [&](int i, bool current) {
    return std::string(current ? "Current thread " : "Thread ") + Hex(p.tid - 0x800000 * i) +
           " (most recent call first):\n";
  };
  std::string s = "Python stacks (faulthandler):\n";
  int i = 0;
  for (int t = 0; t < p.loader_threads; ++t, ++i) {
    s += thread(i, false) + "  File \"" + p.stdlib + "/threading.py\", line 331 in wait\n" +
         "  File \"" + p.stdlib + "/queue.py\", line 180 in get\n" + "  File \"" + p.site +
         "/torch/utils/data/_utils/pin_memory.py\", line " + std::to_string(31 + t) +
         " in do_one_step\n" + "  File \"" + p.site +
         "/torch/utils/data/_utils/pin_memory.py\", line 54 in _pin_memory_loop\n" + "  File \"" +
         p.stdlib + "/threading.py\", line 982 in run\n" + "  File \"" + p.stdlib +
         "/threading.py\", line 1045 in _bootstrap_inner\n" + "  File \"" + p.stdlib +
         "/threading.py\", line 1002 in _bootstrap\n\n";
  }
  s += thread(i++, true);
  if (p.hung) {
    s += "  File \"" + p.site + "/endure/__init__.py\", line 184 in begin_step\n";
  } else if (p.sleeping) {
    s += "  File \"/work/examples/python/train_gpt.py\", line 240 in wait_for_file\n";
  } else {
    s += "  File \"" + p.site +
         "/torch/distributed/distributed_c10d.py\", line 2501 in all_reduce\n" + "  File \"" +
         p.site + "/torch/distributed/c10d_logger.py\", line 79 in wrapper\n" +
         "  File \"/work/examples/python/train_gpt.py\", line 262 in average_gradients\n";
  }
  s += "  File \"/work/examples/python/train_gpt.py\", line 301 in train\n"
       "  File \"/work/examples/python/train_gpt.py\", line 349 in <module>\n";
  return s;
}

TEST(StackSignature, IgnoresAddressesThreadIdsArgumentsAndLineNumbers) {
  RankProcess a;
  RankProcess b{.base = 0x7fa0b3000000,
                .heap = 0x5599c1000000,
                .lwp = 777,
                .step = 99,
                .allreduce_line = 230};
  const std::string sig = StackSignature(GdbDump(a));
  EXPECT_EQ(sig, StackSignature(GdbDump(b)));
  EXPECT_THAT(sig, Not(HasSubstr("0x")));
  EXPECT_THAT(sig, Not(HasSubstr("LWP")));
  EXPECT_THAT(sig, Not(HasSubstr("Thread")));
  EXPECT_THAT(sig, Not(HasSubstr("step=")));
  EXPECT_THAT(sig, Not(HasSubstr("train.cc")));
  EXPECT_THAT(sig, Not(HasSubstr("this=")));
  // The frames are kept, in call order, with the C++ names but not their
  // parameter lists.
  EXPECT_THAT(sig, HasSubstr("std::condition_variable::wait <- "
                             "c10d::ProcessGroupGloo::AsyncWork::wait <- "
                             "endure::trainer::Allreduce <- endure::trainer::RunTraining <- main"));
  EXPECT_THAT(sig, HasSubstr("gloo::transport::tcp::Loop::run <- ?? <- start_thread <- clone3"));
}

TEST(StackSignature, ThreadOrderAndPoolSizeDoNotMatter) {
  RankProcess a{.pool_threads = 1};
  RankProcess b{.lwp = 501, .pool_threads = 7, .reversed = true};
  EXPECT_EQ(StackSignature(GdbDump(a)), StackSignature(GdbDump(b)));
  // A run of unresolved frames counts once: "?? <- ??" is "??".
  EXPECT_THAT(StackSignature(GdbDump(a)),
              HasSubstr("gomp_team_barrier_wait_end <- ?? <- start_thread"));
}

TEST(StackSignature, DependsOnTheFunctionsEachThreadIsIn) {
  RankProcess in_allreduce;
  RankProcess asleep{.hung = true};
  EXPECT_NE(StackSignature(GdbDump(in_allreduce)), StackSignature(GdbDump(asleep)));
  EXPECT_THAT(StackSignature(GdbDump(asleep)),
              HasSubstr("std::this_thread::sleep_for<long, std::ratio<1l, 1l> > <- "
                        "endure::Session::Impl::FireFaults <- endure::Session::BeginStep"));
  // The same functions on different threads are different stacks.
  EXPECT_NE(StackSignature("Thread 1 (main):\n#0 a\n#1 b\nThread 2 (x):\n#0 c\n"),
            StackSignature("Thread 1 (main):\n#0 a\nThread 2 (x):\n#0 b\n#1 c\n"));
}

TEST(StackSignature, ReadsRealGdbFrameForms) {
  // Frames as gdb 13 printed them for a test program (addresses, inlined
  // frames without one, demangled names with their own parentheses).
  const std::string a =
      "Thread 1 (Thread 0x7ff80e233740 (LWP 29753) \"hang\"):\n"
      "#4  ___pthread_cond_wait (cond=0x55e3a6d03120 <cv>, mutex=0x55e3a6d030e0 <mu>) at "
      "./nptl/pthread_cond_wait.c:618\n"
      "#5  0x000055e3a6cfe821 in std::condition_variable::wait<gloo::Buf::waitRecv(int)::"
      "{lambda()#1}>(std::unique_lock<std::mutex>&, gloo::Buf::waitRecv(int)::{lambda()#1}) "
      "(this=0x55e3a6d03120 <cv>, __lock=..., __p=...) at /usr/include/c++/12/"
      "condition_variable:102\n"
      "#6  0x000055e3a6cfe6ac in gloo::Buf::waitRecv (this=0x7ffc1008b47f, n=5) at hang.cc:7\n"
      "#7  0x000055e3a6cfe291 in Allreduce (n=5) at hang.cc:8\n"
      "#8  0x00007ff80e0d44a3 in std::thread::_Invoker<std::tuple<void (*)()> >::operator() "
      "(this=0x55e3dd5e9048) at /usr/include/c++/12/bits/std_thread.h:259\n"
      "#9  0x000055e3a6cfe385 in foo [clone .isra.0] (s=0x55 \"stuck at (x\") at hang.cc:12\n"
      "#10 0x00007f64044a71f5 in <signal handler called>\n"
      "Backtrace stopped: previous frame inner to this frame (corrupt stack?)\n"
      "[Inferior 1 (process 29753) detached]\n";
  EXPECT_EQ(StackSignature(a),
            "___pthread_cond_wait <- std::condition_variable::wait<gloo::Buf::waitRecv(int)::"
            "{lambda()#1}> <- gloo::Buf::waitRecv <- Allreduce <- "
            "std::thread::_Invoker<std::tuple<void (*)()> >::operator() <- foo <- "
            "<signal handler called>");
  // The bare frames of hand-written dumps, and of the agent's tests.
  EXPECT_EQ(StackSignature("#0 nanosleep\n#1 endure::Session::BeginStep"),
            "nanosleep <- endure::Session::BeginStep");
  EXPECT_EQ(StackSignature("Thread 1 (main):\n#0 nccl_wait"), "nccl_wait");
}

TEST(StackSignature, ReadsFaulthandlerDumps) {
  PythonRank a;
  PythonRank b{.site = "/home/alice/.venv/lib/python3.11/site-packages",
               .tid = 0x00007f0000001000,
               .loader_threads = 3};
  const std::string sig = StackSignature(PythonDump(a));
  EXPECT_EQ(sig, StackSignature(PythonDump(b)));
  EXPECT_THAT(sig, HasSubstr("all_reduce (distributed_c10d.py) <- wrapper (c10d_logger.py) <- "
                             "average_gradients (train_gpt.py) <- train (train_gpt.py) <- "
                             "<module> (train_gpt.py)"));
  EXPECT_THAT(sig, Not(HasSubstr("line")));
  EXPECT_THAT(sig, Not(HasSubstr("/opt/venv")));
  EXPECT_NE(sig, StackSignature(PythonDump(PythonRank{.sleeping = true})));
  EXPECT_EQ(StackSignature("Stack (most recent call first):\n  <no Python frame>\n"),
            "<no Python frame>");
}

// py-spy reads a stopped interpreter from outside (agent/stack_capture.h):
// the same frames read the same as the program's own faulthandler dump.
TEST(StackSignature, ReadsPySpyDumpsAsFaulthandlers) {
  const std::string py_spy =
      "Python stacks (py-spy, read from outside):\n"
      "Process 4242: python3 /work/examples/python/train_gpt.py\n"
      "Python v3.11.2 (/usr/bin/python3.11)\n\n"
      "Thread 4242 (idle): \"MainThread\"\n"
      "    all_reduce (/srv/venv/lib/python3.11/site-packages/torch/distributed/"
      "distributed_c10d.py:2511)\n"
      "    wrapper (/srv/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:80)\n"
      "    Trainer.average_gradients (/work/examples/python/train_gpt.py:262)\n"
      "    train (/work/examples/python/train_gpt.py:301)\n"
      "    <module> (/work/examples/python/train_gpt.py:349)\n";
  EXPECT_EQ(StackSignature(py_spy), StackSignature(PythonDump(PythonRank{.loader_threads = 0})));
  EXPECT_THAT(StackSignature(py_spy), HasSubstr("all_reduce (distributed_c10d.py) <- wrapper"));
  // Its "MainThread" is the main thread, wherever it is listed: a rank read
  // by py-spy groups with the ranks that dumped their own stacks, and
  // stands out when it is elsewhere.
  const std::string loader =
      "Thread 4250 (idle): \"pin_memory\"\n"
      "    wait (/usr/lib/python3.11/threading.py:331)\n"
      "    _bootstrap (/usr/lib/python3.11/threading.py:1002)\n";
  const std::string stuck = std::string(py_spy).insert(py_spy.find("Thread 4242"), loader);
  std::string asleep = stuck.substr(0, stuck.find("    all_reduce")) +
                       "    wait_for_file (/work/examples/python/train_gpt.py:240)\n" +
                       stuck.substr(stuck.find("    train ("));
  const std::vector<std::pair<Rank, std::string>> ranks = {
      {Rank{0}, PythonDump(PythonRank{})},
      {Rank{1}, PythonDump(PythonRank{.loader_threads = 2})},
      {Rank{2}, PythonDump(PythonRank{})}};
  std::vector<std::pair<Rank, std::string>> with_stuck = ranks, with_asleep = ranks;
  with_stuck.emplace_back(Rank{3}, stuck);
  with_asleep.emplace_back(Rank{3}, asleep);
  EXPECT_EQ(GroupStacks(with_stuck).groups.size(), 1u) << GroupStacks(with_stuck).reason;
  EXPECT_EQ(GroupStacks(with_asleep).suspects, std::vector<Rank>{Rank{3}})
      << GroupStacks(with_asleep).reason;
}

TEST(StackSignature, ReadsBacktraceSymbols) {
  const std::string a =
      "./trainer(_ZN6endure7trainer9AllreduceEPvi+0x1a) [0x55d0c8a1b2c4]\n"
      "./trainer(main+0x44) [0x55d0c8a1b400]\n"
      "/lib/x86_64-linux-gnu/libc.so.6(+0x29d90) [0x7f3b2a429d90]\n";
  const std::string b =
      "./trainer(_ZN6endure7trainer9AllreduceEPvi+0x2b) [0x5611aa01b2d5]\n"
      "./trainer(main+0x44) [0x5611aa01b400]\n"
      "/lib/x86_64-linux-gnu/libc.so.6(+0x29d90) [0x7f0011229d90]\n";
  EXPECT_EQ(StackSignature(a), "endure::trainer::Allreduce <- main <- ??");
  EXPECT_EQ(StackSignature(a), StackSignature(b));
  // backtrace_symbols_fd's lines (the C++ client's own dump): no space
  // before the address.
  const std::string fd =
      "Native stack of the training thread (most recent call first):\n"
      "./trainer(_ZN6endure7trainer9AllreduceEPvi+0x1a)[0x55d0c8a1b2c4]\n"
      "./trainer(main+0x44)[0x55d0c8a1b400]\n"
      "/lib/x86_64-linux-gnu/libc.so.6(+0x29d90)[0x7f3b2a429d90]\n";
  EXPECT_EQ(StackSignature(fd), StackSignature(a));
}

TEST(StackSignature, EmptyWhenTheDumpHoldsNoFrame) {
  EXPECT_EQ(StackSignature(""), "");
  EXPECT_EQ(StackSignature("stack capture timed out after 5000 ms"), "");
  EXPECT_EQ(StackSignature("stack capture failed: cannot create a temporary file"), "");
  EXPECT_EQ(StackSignature("Python stacks (faulthandler):\n"), "");
  EXPECT_EQ(StackSignature("Python v3.11.2 (/usr/bin/python3.11)\n"
                           "not captured: gdb gave no stacks within the 2000 ms stack deadline "
                           "(stack_timeout); the stop went on without them"),
            "");
}

TEST(GroupStacks, NamesTheMinorityRankOfFour) {
  const StackGroups g = GroupStacks(FourGdbRanks());
  EXPECT_TRUE(g.resolved);
  EXPECT_THAT(g.suspects, ElementsAre(Rank{1}));
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_THAT(g.groups[0], ElementsAre(Rank{0}, Rank{2}, Rank{3}));
  EXPECT_THAT(g.groups[1], ElementsAre(Rank{1}));
  EXPECT_THAT(g.locations, ElementsAre("Allreduce", "BeginStep > sleep_for"));
  EXPECT_EQ(g.reason,
            "3 of 4 ranks share one stack (in Allreduce); rank 1 differs (in BeginStep > "
            "sleep_for)");
}

// Found by the 2 x 2 hang test: rank 2's main thread waited in the
// allreduce like ranks 0 and 3, but one of Gloo's own threads was caught
// sending. Ranks are grouped by their main thread, so only the sleeping
// rank stands out.
TEST(GroupStacks, OtherThreadsCaughtElsewhereDoNotSplitAGroup) {
  const std::string allreduce =
      "Thread 1 (Thread 0x7f01 (LWP 11)):\n"
      "#0  0x1 in syscall () from /lib/libc.so.6\n"
      "#1  0x2 in gloo::transport::tcp::UnboundBuffer::waitRecv(int*, long) ()\n"
      "#2  0x3 in c10d::ProcessGroupGloo::AllreduceWork::run() ()\n"
      "#3  0x4 in Trainer::Step(long) ()\n"
      "#4  0x5 in main ()\n";
  const std::string gloo_idle =
      "Thread 2 (Thread 0x7f02 (LWP 12)):\n"
      "#0  0x6 in epoll_wait () from /lib/libc.so.6\n"
      "#1  0x7 in gloo::transport::tcp::Loop::run() ()\n";
  const std::string gloo_sending =
      "Thread 2 (Thread 0x7f03 (LWP 13)):\n"
      "#0  0x8 in send () from /lib/libc.so.6\n"
      "#1  0x9 in gloo::transport::tcp::Pair::waitSend(gloo::transport::tcp::UnboundBuffer*) ()\n"
      "#2  0xa in gloo::transport::tcp::Loop::run() ()\n";
  const std::string sleeping =
      "Thread 1 (Thread 0x7f04 (LWP 14)):\n"
      "#0  0xb in clock_nanosleep () from /lib/libc.so.6\n"
      "#1  0xc in endure::Session::BeginStep(long) ()\n"
      "#2  0x4 in Trainer::Step(long) ()\n"
      "#3  0x5 in main ()\n";
  const StackGroups g = GroupStacks({{Rank{0}, allreduce + gloo_idle},
                                     {Rank{1}, sleeping + gloo_idle},
                                     {Rank{2}, allreduce + gloo_sending},
                                     {Rank{3}, allreduce + gloo_idle}});
  EXPECT_TRUE(g.resolved) << g.reason;
  EXPECT_THAT(g.suspects, ElementsAre(Rank{1}));
  EXPECT_THAT(g.groups[0], ElementsAre(Rank{0}, Rank{2}, Rank{3}));
}

TEST(GroupStacks, NamesTheMinorityOfPythonRanks) {
  std::vector<std::pair<Rank, std::string>> dumps;
  for (int r = 0; r < 4; ++r) {
    PythonRank p{.tid = 0x00007f8e4b7fe640 + 0x10000000ull * r, .loader_threads = 1 + r % 2};
    if (r == 2) p.hung = true;
    if (r % 2 == 1) p.site = "/home/bob/venv/lib/python3.11/site-packages";
    dumps.emplace_back(Rank{r}, PythonDump(p));
  }
  const StackGroups g = GroupStacks(dumps);
  EXPECT_TRUE(g.resolved);
  EXPECT_THAT(g.suspects, ElementsAre(Rank{2}));
  EXPECT_EQ(g.reason,
            "3 of 4 ranks share one stack (in average_gradients > all_reduce); rank 2 differs "
            "(in begin_step)");
}

TEST(GroupStacks, ATieIsUnresolved) {
  std::vector<std::pair<Rank, std::string>> dumps;
  for (int r = 0; r < 4; ++r) {
    dumps.emplace_back(Rank{r}, GdbDump(RankProcess{.lwp = 100 * r, .hung = r >= 2}));
  }
  const StackGroups g = GroupStacks(dumps);
  EXPECT_FALSE(g.resolved);
  EXPECT_THAT(g.suspects, IsEmpty());
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_THAT(g.groups[0], ElementsAre(Rank{0}, Rank{1}));  // the tie: lowest rank first
  EXPECT_THAT(g.groups[1], ElementsAre(Rank{2}, Rank{3}));
  EXPECT_EQ(g.reason,
            "no stack is shared by a strict majority of the 4 ranks: ranks 0-1 (in Allreduce), "
            "ranks 2-3 (in BeginStep > sleep_for)");
}

TEST(GroupStacks, AllEqualIsUnresolved) {
  std::vector<std::pair<Rank, std::string>> dumps;
  for (int r = 0; r < 4; ++r) {
    dumps.emplace_back(Rank{r}, GdbDump(RankProcess{.lwp = 100 * r, .pool_threads = 1 + r}));
  }
  const StackGroups g = GroupStacks(dumps);
  EXPECT_FALSE(g.resolved);
  EXPECT_THAT(g.suspects, IsEmpty());
  ASSERT_EQ(g.groups.size(), 1u);
  EXPECT_EQ(g.reason, "all 4 ranks share one stack (in Allreduce): no outlier");

  const StackGroups one = GroupStacks({{Rank{0}, GdbDump(RankProcess{})}});
  EXPECT_FALSE(one.resolved);
  EXPECT_THAT(one.reason, HasSubstr("nothing to compare it with"));
}

TEST(GroupStacks, ARankWithoutAStackIsItsOwnGroup) {
  std::vector<std::pair<Rank, std::string>> dumps = FourGdbRanks();
  dumps[1].second = "stack capture timed out after 5000 ms";
  StackGroups g = GroupStacks(dumps);
  EXPECT_TRUE(g.resolved);
  EXPECT_THAT(g.suspects, ElementsAre(Rank{1}));
  EXPECT_THAT(g.locations, ElementsAre("Allreduce", "no stack"));
  EXPECT_EQ(g.reason, "3 of 4 ranks share one stack (in Allreduce); rank 1 has no stack");

  // Ranks without a stack never make a majority that clears the others.
  for (int r = 1; r < 4; ++r) dumps[r].second = "";
  g = GroupStacks(dumps);
  EXPECT_FALSE(g.resolved);
  EXPECT_THAT(g.suspects, IsEmpty());
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_THAT(g.groups[1], ElementsAre(Rank{1}, Rank{2}, Rank{3}));
  EXPECT_THAT(g.reason, HasSubstr("ranks 1-3 have no stack"));

  g = GroupStacks({{Rank{0}, ""}, {Rank{1}, "stack capture failed: gdb missing"}});
  EXPECT_FALSE(g.resolved);
  EXPECT_EQ(g.reason, "no rank's dump held a stack (ranks 0-1)");
  EXPECT_EQ(GroupStacks({}).reason, "no stacks to compare");
}

TEST(GroupStacks, SeveralOutlierGroupsAreAllSuspects) {
  std::vector<std::pair<Rank, std::string>> dumps;
  for (int r = 0; r < 8; ++r) {
    PythonRank p{.tid = 0x00007f8e4b7fe640 + 0x1000ull * r};
    if (r == 3 || r == 6) p.hung = true;
    if (r == 7) p.sleeping = true;
    dumps.emplace_back(Rank{r}, PythonDump(p));
  }
  dumps.emplace_back(Rank{3}, PythonDump(PythonRank{}));  // a second dump of rank 3: ignored
  const StackGroups g = GroupStacks(dumps);
  EXPECT_TRUE(g.resolved);
  EXPECT_THAT(g.suspects, ElementsAre(Rank{3}, Rank{6}, Rank{7}));
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_THAT(g.groups[1], ElementsAre(Rank{3}, Rank{6}));
  EXPECT_EQ(g.reason,
            "5 of 8 ranks share one stack (in average_gradients > all_reduce); ranks 3, 6 differ "
            "(in begin_step); rank 7 differs (in wait_for_file)");
}

}  // namespace
}  // namespace endure::core
