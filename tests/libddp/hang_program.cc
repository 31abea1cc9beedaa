// A library user's loop with one misbehaving rank, for hang_test.sh: rank 1 stops itself with
// SIGSTOP, spins in its own code, skips one all-reduce, all-reduces a tensor of another size, or
// waits for a file (suspend), always at the loop's 4th iteration (the 3rd for the skip). The launcher's hang report must name
// rank 1, the collective and the function. argv: scenario backend timeout_s report_dir [check].
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>
#include <string>

// Not static, not inlined: the hang report's stack must show them by name.
__attribute__((noinline)) void stopHereForHangTest() {
  std::raise(SIGSTOP);
  asm volatile("" ::: "memory");  // no tail call: this frame stays on the stack
}
__attribute__((noinline)) void spinInUserCodeForHangTest(volatile long* counter) {
  for (;;) ++*counter;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: hang_program stop|stop0|late|quit|spin|skip|size|suspend|clean BACKEND TIMEOUT_S REPORT_DIR [check]\n";
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    ddp::InitOptions options;
    options.backend = ddp::parseBackend(argv[2]).value();
    options.timeout = std::chrono::seconds(std::atoi(argv[3]));
    options.hangReportDir = argv[4];
    options.checkCollectives = argc > 5 && std::string(argv[5]) == "check";
    ddp::ProcessGroup group = ddp::initProcessGroup(options);
    const int rank = group.rank();
    for (int i = 1; i <= 6; ++i) {
      torch::Tensor x = torch::ones({1000});
      if (rank == 1 && scenario == "skip" && i == 3) continue;
      if (rank == 0 && i == 4 && scenario == "stop0") stopHereForHangTest();  // the store's host
      if (rank == 0 && i == 4 && scenario == "suspend") std::cout << "rank 0 pid " << ::getpid() << " enters #4" << std::endl;
      if (rank == 1 && i == 4) {
        // "quit": rank 1 returns 0 before collective #4, which rank 0 then waits in (blocked, not working).
        if (scenario == "quit") {
          std::cout << "rank 1 finished" << std::endl;
          std::_Exit(0);
        }
        if (scenario == "stop") stopHereForHangTest();
        if (scenario == "spin") {
          long counter = 0;
          spinInUserCodeForHangTest(&counter);
        }
        if (scenario == "size") x = torch::ones({999});
        // "suspend": rank 1 comes to all-reduce #4 once REPORT_DIR/go exists (rank 0 waits in it
        // meanwhile, and the test stops and continues rank 0 there for longer than the timeout).
        if (scenario == "suspend") {
          std::cout << "rank 1 waits for go" << std::endl;
          while (!std::ifstream(std::string(argv[4]) + "/go")) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
      ddp::AllReduceOptions loss;
      loss.label = "the loss";  // named in the hang report and the mismatch lines
      group.allReduce(x, loss);
    }
    group.barrier();
    group.destroy();
    // "late": rank 0 saves alone for 3 s (no CPU time, no collective) after rank 1 returned: working.
    if (scenario == "late" && rank == 0) std::this_thread::sleep_for(std::chrono::seconds(3));
    std::cout << "rank " << rank << " finished" << std::endl;
    return 0;
  } catch (const ddp::Error& e) {
    std::cerr << "caught ddp::Error: " << e.what() << std::endl;
    return 3;
  }
}
