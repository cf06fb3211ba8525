/* Work items shared between OpenMP threads as the static schedule shares them, each thread a
 * run of consecutive items, except that a thread done with its own run takes items from the end
 * of another's that it has not started.
 *
 * Why: consecutive kernels of a training step split the same rows the same way, so each thread
 * finds its rows in its own core's cache (handing items out one by one as threads come free,
 * OpenMP's dynamic schedule, measured slower over a step for that reason). But on a shared
 * machine one core often runs slower than the other for a while, and with fixed runs the faster
 * then waits for it at the end of every call; here it takes over the slower one's last items.
 * Each item's results are the same whichever thread computes it. SCRATCHGPT_SHARES=static
 * (read at each call) keeps every thread to its own run, as OpenMP's static schedule does.
 *
 *     Shares sh;
 *     #pragma omp parallel
 *     {
 *         int t = shares_begin(&sh, n);
 *         for (long i; (i = take(&sh, t)) >= 0;) work(i);
 *     }
 */
#ifndef SCRATCHGPT_SHARES_H
#define SCRATCHGPT_SHARES_H
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 64 /* threads past this many own no run: they only take from others' */

typedef struct {
    _Alignas(64) uint64_t next_end; /* the run's next item << 32 | its end */
} Run;

typedef struct {
    int runs, steal; /* steal: whether a thread done with its run takes from others' */
    Run run[MAX_RUNS];
} Shares;

/* Called by every thread of the team: the runs of items 0 .. n - 1 set up by one of them (the
 * others wait for it); returns the calling thread's number. */
static inline int shares_begin(Shares *s, long n) {
#pragma omp single
    {
        int runs = omp_get_num_threads() < MAX_RUNS ? omp_get_num_threads() : MAX_RUNS;
        const char *kind = getenv("SCRATCHGPT_SHARES");
        s->runs = runs;
        s->steal = !(kind && strcmp(kind, "static") == 0);
        for (int t = 0; t < runs; t++)
            s->run[t].next_end = (uint64_t)(n * t / runs) << 32 | (uint64_t)(n * (t + 1) / runs);
    }
    return omp_get_thread_num();
}

/* thread t's own run of items, [*lo, *hi), as shares_begin set it up (read it before any
 * thread takes from it; empty for a thread past MAX_RUNS) */
static inline void own_run(const Shares *s, int t, long *lo, long *hi) {
    uint64_t v = t < s->runs ? s->run[t].next_end : 0;
    *lo = (long)(v >> 32), *hi = (long)(v & 0xFFFFFFFFu);
}

/* the item at the front of run r (own) or at its back (another's), or -1 when it has none left */
static inline long take_from(Run *r, int own) {
    uint64_t v = __atomic_load_n(&r->next_end, __ATOMIC_ACQUIRE);
    while ((v >> 32) < (v & 0xFFFFFFFFu)) {
        uint64_t w = own ? v + ((uint64_t)1 << 32) : v - 1;
        if (__atomic_compare_exchange_n(&r->next_end, &v, w, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return own ? (long)(v >> 32) : (long)(v & 0xFFFFFFFFu) - 1;
    }
    return -1;
}

/* thread t's next item: its own run's next, else the last not started of the others' runs; -1
 * when every item is taken */
static inline long take(Shares *s, int t) {
    long i = t < s->runs ? take_from(&s->run[t], 1) : -1;
    for (int k = 1; i < 0 && s->steal && k <= s->runs; k++) i = take_from(&s->run[(t + k) % s->runs], 0);
    return i;
}
#endif
