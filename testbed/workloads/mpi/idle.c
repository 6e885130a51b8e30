/* Preloaded into every MPI rank (traffic.engine mpi): sched_yield() sleeps IDLE_NS instead of returning at once.
 *
 * Open MPI and UCX wait by polling; with mpi_yield_when_idle a progress pass that found nothing calls
 * sched_yield(). On a real cluster the polling core is the application's own; here the ranks share two cores
 * with the emulated fabric (veth, shapers, the switch program run in softirq), and a core kept busy by polling
 * ranks is what the CPU guard rightly flags. A short sleep frees the core for the fabric at the cost of up to
 * one sleep per idle pass of a waiting rank (50 µs, against transfers of milliseconds at emulated rates). */
#include <sched.h>
#include <time.h>

#define IDLE_NS 50000

int sched_yield(void)
{
	struct timespec t = {0, IDLE_NS};

	nanosleep(&t, NULL);
	return 0;
}
