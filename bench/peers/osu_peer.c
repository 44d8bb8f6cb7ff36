/* OSU-methodology ping-pong, bandwidth and bi-directional bandwidth over MPI,
 * the peer that fmx-perf compares itself with (same sizes, iterations, window,
 * output format). Build: mpicc.mpich -O2 osu_peer.c -o osu_peer_mpich
 * Run: mpiexec.hydra -n 2 -bind-to core ./osu_peer_mpich latency|bw|bibw|mbw_mr [max_size [iterations [stats]]]
 * mbw_mr (osu_mbw_mr): ranks 0..n/2-1 each stream a window to rank + n/2 at
 * once; aggregate MB/s and messages/s over the slowest sender, from max_size only.
 * With "stats", latency also times every round trip and prints perftest's
 * columns (t_min, t_max, t_typical, t_avg, t_stdev, 99% and 99.9%), as
 * fmx-perf latency --stats does, from max_size only. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, integer arithmetic, as fmx-perf's stats.rs. */
static double pct(const double *v, size_t n, size_t per_mille) {
    size_t rank = (per_mille * n + 999) / 1000;
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return v[rank - 1];
}

#define LARGE 8192
#define WINDOW 64

static void loops(int test, size_t size, int *iters, int *skip) {
    int large = size > LARGE;
    if (test == 0) { *iters = large ? 1000 : 10000; *skip = large ? 100 : 1000; }
    else { *iters = large ? 20 : 100; *skip = large ? 2 : 10; }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *t = argc > 1 ? argv[1] : "latency";
    int test = strcmp(t, "bw") == 0 ? 1 : strcmp(t, "bibw") == 0 ? 2 : strcmp(t, "mbw_mr") == 0 ? 3 : 0;
    int pairs = size / 2;
    size_t max = argc > 2 ? strtoull(argv[2], NULL, 10) : (4u << 20);
    int iters_arg = argc > 3 ? atoi(argv[3]) : 0;
    int stats = argc > 4 && strcmp(argv[4], "stats") == 0 && test == 0;
    char *s = aligned_alloc(4096, max + 4096), *r = aligned_alloc(4096, max + 4096);
    memset(s, 'a', max); memset(r, 'b', max);
    MPI_Request req[2 * WINDOW];
    if (rank == 0 && test == 3) printf("# OSU-methodology mbw_mr (MPI peer), %d pairs\n# Size %21s %17s\n", pairs, "MB/s", "Messages/s");
    else if (rank == 0 && !stats) printf("# OSU-methodology %s (MPI peer)\n# Size %22s\n", t, test == 0 ? "Latency (us)" : "Bandwidth (MB/s)");
    if (rank == 0 && stats) printf("# OSU-methodology latency (MPI peer), perftest's statistics\n");
    for (size_t sz = stats || test == 3 ? max : 1; sz <= max; sz *= 2) {
        int iters, skip; loops(test, sz, &iters, &skip);
        if (iters_arg > 0) iters = iters_arg;
        double *samples = stats ? malloc(sizeof(double) * iters) : NULL;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = 0, last = 0;
        for (int i = 0; i < iters + skip; i++) {
            if (i == skip) t0 = last = MPI_Wtime();
            else if (stats && i > skip) { double now = MPI_Wtime(); samples[i - skip - 1] = (now - last) * 1e6 / 2; last = now; }
            if (test == 0) {
                if (rank == 0) { MPI_Send(s, sz, MPI_CHAR, 1, 1, MPI_COMM_WORLD); MPI_Recv(r, sz, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
                else if (rank == 1) { MPI_Recv(r, sz, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(s, sz, MPI_CHAR, 0, 1, MPI_COMM_WORLD); }
            } else if (test == 1) {
                char ack[4];
                if (rank == 0) {
                    for (int w = 0; w < WINDOW; w++) MPI_Isend(s, sz, MPI_CHAR, 1, 1, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Recv(ack, 4, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    for (int w = 0; w < WINDOW; w++) MPI_Irecv(r, sz, MPI_CHAR, 0, 1, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Send(ack, 4, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
                }
            } else if (test == 3) {
                char ack[4];
                if (rank < pairs) {
                    for (int w = 0; w < WINDOW; w++) MPI_Isend(s, sz, MPI_CHAR, rank + pairs, 1, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Recv(ack, 4, MPI_CHAR, rank + pairs, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank < 2 * pairs) {
                    for (int w = 0; w < WINDOW; w++) MPI_Irecv(r, sz, MPI_CHAR, rank - pairs, 1, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Send(ack, 4, MPI_CHAR, rank - pairs, 2, MPI_COMM_WORLD);
                }
            } else if (rank < 2) {
                int peer = 1 - rank;
                for (int w = 0; w < WINDOW; w++) MPI_Irecv(r, sz, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &req[w]);
                for (int w = 0; w < WINDOW; w++) MPI_Isend(s, sz, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &req[WINDOW + w]);
                MPI_Waitall(2 * WINDOW, req, MPI_STATUSES_IGNORE);
            }
        }
        double el = MPI_Wtime() - t0;
        if (stats) {
            samples[iters - 1] = (MPI_Wtime() - last) * 1e6 / 2;
            if (rank == 0) {
                qsort(samples, iters, sizeof(double), cmp);
                double sum = 0, sq = 0;
                for (int i = 0; i < iters; i++) sum += samples[i];
                double avg = sum / iters;
                for (int i = 0; i < iters; i++) sq += (samples[i] - avg) * (samples[i] - avg);
                printf("%7zu %11d %14.2f %14.2f %16.2f %14.2f %16.2f %22.2f %24.2f\n", sz, iters, samples[0], samples[iters - 1],
                       samples[iters / 2], avg, sqrt(sq / iters), pct(samples, iters, 990), pct(samples, iters, 999));
                fflush(stdout);
            }
            free(samples);
            continue;
        }
        if (test == 3) {
            double mine = rank < pairs ? el : 0, slowest = 0;
            MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                double msgs = (double)pairs * WINDOW * iters;
                printf("%-10zu%17.2f %17.2f\n", sz, msgs * sz / slowest / 1e6, msgs / slowest);
                fflush(stdout);
            }
            continue;
        }
        if (rank == 0) {
            double v = test == 0 ? el * 1e6 / (2.0 * iters) : (double)sz * iters * WINDOW * (test == 2 ? 2 : 1) / el / 1e6;
            printf("%-10zu%18.2f\n", sz, v);
            fflush(stdout);
        }
    }
    free(s); free(r);
    MPI_Finalize();
    return 0;
}
