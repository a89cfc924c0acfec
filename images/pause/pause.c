/*
 * pgop-pause: the process that holds a Pod sandbox's namespaces.
 *
 * Run as PID 1 of the sandbox, it sleeps until SIGINT or SIGTERM and then exits 0.
 * Processes re-parented to it (PID 1 adopts orphans when the Pod shares its PID
 * namespace) are reaped on SIGCHLD so that no zombie stays behind.
 *
 * Signals are taken synchronously: all three are blocked and fetched one at a time
 * with sigwaitinfo(), so there is no handler and no async-signal-safety to get wrong.
 *
 * Build: gcc -static -Os -s -o pause pause.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PAUSE_VERSION
#define PAUSE_VERSION "dev"
#endif

static void reap_children(void)
{
	/* Several children may have ended behind one coalesced SIGCHLD: collect all. */
	for (;;) {
		pid_t pid = waitpid(-1, NULL, WNOHANG);
		if (pid > 0)
			continue;
		if (pid < 0 && errno == EINTR)
			continue;
		return; /* 0: children left, none ended; -1/ECHILD: no children at all */
	}
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-v") == 0) {
			printf("pgop-pause %s\n", PAUSE_VERSION);
			return 0;
		}
		fprintf(stderr, "usage: %s [--version]\n"
				"Sleeps until SIGINT or SIGTERM, reaping children, then exits 0.\n",
			argv[0]);
		return 2;
	}
	if (getpid() != 1)
		fprintf(stderr, "pgop-pause: warning: not PID 1, orphans are not re-parented to me\n");

	sigset_t wanted;
	sigemptyset(&wanted);
	sigaddset(&wanted, SIGINT);
	sigaddset(&wanted, SIGTERM);
	sigaddset(&wanted, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &wanted, NULL) != 0) {
		perror("pgop-pause: sigprocmask");
		return 1;
	}

	for (;;) {
		siginfo_t info;
		int sig = sigwaitinfo(&wanted, &info);
		if (sig < 0) {
			if (errno == EINTR)
				continue;
			perror("pgop-pause: sigwaitinfo");
			return 1;
		}
		switch (sig) {
		case SIGCHLD:
			reap_children();
			break;
		case SIGINT:
		case SIGTERM:
			reap_children();
			return 0;
		default:
			break;
		}
	}
}
