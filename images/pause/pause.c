/* pause: the sandbox process of every pod on a node. It holds the pod's namespaces,
 * reaps the zombies handed to it as PID 1, and exits 0 on SIGINT or SIGTERM.
 * Built static by images/binaries.py (make images) into the image infergrid/pause. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

static void on_child(int sig) { (void)sig; }

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "-v") == 0) {
    puts("infergrid-pause 1");
    return 0;
  }
  if (argc != 1) {
    fprintf(stderr, "usage: %s [-v]\n", argv[0]);
    return 2;
  }
  if (getpid() != 1)
    fprintf(stderr, "pause: not PID 1: only its own children are reaped\n");

  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  sigemptyset(&stop.sa_mask);
  sigemptyset(&child.sa_mask);
  if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) ||
      sigaction(SIGCHLD, &child, NULL)) {
    perror("pause: sigaction");
    return 1;
  }
  /* The signals stay blocked except inside sigsuspend, so none is lost between the
   * check of stop_signal and the wait. */
  sigset_t watched, waiting;
  sigemptyset(&watched);
  sigaddset(&watched, SIGINT);
  sigaddset(&watched, SIGTERM);
  sigaddset(&watched, SIGCHLD);
  sigprocmask(SIG_BLOCK, &watched, &waiting);
  sigdelset(&waiting, SIGINT);
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGCHLD);
  while (!stop_signal) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    sigsuspend(&waiting);
  }
  fprintf(stderr, "pause: signal %d, exiting\n", (int)stop_signal);
  return 0;
}
