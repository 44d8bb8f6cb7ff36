/* The peer of `fmx-perf neighbor`: Example 7.4 of the MPI Forum ticket (a
 * P x Q torus with diagonals, weights 2 and 1; Q = 2 from 4 ranks, else 1),
 * built with MPI_Dist_graph_create (one source per rank, degree 8, reorder
 * off), exchanging k doubles per neighbour with MPI_Neighbor_alltoallv.
 * Prints `k us` rows: microseconds per exchange, mean over ranks.
 * Build: mpicc.mpich -O2 neighbor_peer.c -o neighbor_peer_mpich
 * Run:   mpiexec.hydra -n 2 ./neighbor_peer_mpich 1,64,4096,65536 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void iterations(long k, int *iters, int *warmup) {
    if (k <= 64) { *iters = 10000; *warmup = 1000; }
    else if (k <= 4096) { *iters = 1000; *warmup = 100; }
    else { *iters = 100; *warmup = 10; }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int q = (n >= 4 && n % 2 == 0) ? 2 : 1, p = n / q;
    int y = rank / p, x = rank % p;
    int d[8] = {
        p * y + (x + 1) % p, p * y + (p + x - 1) % p,
        p * ((y + 1) % q) + x, p * ((q + y - 1) % q) + x,
        p * ((y + 1) % q) + (x + 1) % p, p * ((q + y - 1) % q) + (x + 1) % p,
        p * ((y + 1) % q) + (p + x - 1) % p, p * ((q + y - 1) % q) + (p + x - 1) % p,
    };
    int w[8] = {2, 2, 2, 2, 1, 1, 1, 1}, src[1] = {rank}, deg[1] = {8};
    MPI_Comm g;
    MPI_Dist_graph_create(MPI_COMM_WORLD, 1, src, deg, d, w, MPI_INFO_NULL, 0, &g);
    int indeg, outdeg, weighted;
    MPI_Dist_graph_neighbors_count(g, &indeg, &outdeg, &weighted);
    const char *list = argc > 1 ? argv[1] : "1,64,4096,65536";
    char *copy = strdup(list);
    if (rank == 0) printf("# MPI_Neighbor_alltoallv, torus %dx%d, %d ranks, k doubles per neighbour\n# k  us/exchange\n", p, q, n);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        long k = atol(tok);
        double *s = malloc(sizeof(double) * k * outdeg + 8), *r = malloc(sizeof(double) * k * indeg + 8);
        int *sc = malloc(sizeof(int) * outdeg), *sd = malloc(sizeof(int) * outdeg);
        int *rc = malloc(sizeof(int) * indeg), *rd = malloc(sizeof(int) * indeg);
        for (int j = 0; j < outdeg; j++) { sc[j] = k; sd[j] = j * k; }
        for (int i = 0; i < indeg; i++) { rc[i] = k; rd[i] = i * k; }
        for (long i = 0; i < k * outdeg; i++) s[i] = rank + i;
        int iters, warmup;
        iterations(k, &iters, &warmup);
        double t0 = 0;
        MPI_Barrier(g);
        for (int it = 0; it < iters + warmup; it++) {
            if (it == warmup) t0 = MPI_Wtime();
            MPI_Neighbor_alltoallv(s, sc, sd, MPI_DOUBLE, r, rc, rd, MPI_DOUBLE, g);
        }
        double us = (MPI_Wtime() - t0) * 1e6 / iters, sum = 0;
        MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, g);
        if (rank == 0) printf("%-10ld%18.2f\n", k, sum / n);
        free(s); free(r); free(sc); free(sd); free(rc); free(rd);
    }
    free(copy);
    MPI_Comm_free(&g);
    MPI_Finalize();
    return 0;
}
