/* The DMR guide's block redistribution (seeds/002), timed: an old world of N
 * ranks spawns M new ranks with MPI_Comm_spawn and moves a block-distributed
 * array of GLOBAL_N doubles over the intercommunicator with MPI_Send/MPI_Recv,
 * exactly as send_state/recv_state in the guide (the receiver mallocs its
 * block). Usage: mpiexec -n N redistribute_peer GLOBAL_N M REPS
 * Prints "seconds <best> <median>" from old rank 0.
 * With a fifth argument "static" (mpiexec -n N+M ... static) the two worlds are
 * the first N and last M ranks of one job, joined by MPI_Intercomm_create: for
 * MPIs that cannot spawn (MPICH's ch4:ucx); the timed part is the same. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void block_range(long rank, long size, long n, long *start, long *count)
{
    long base = n / size, rem = n % size;
    *start = rank * base + (rank < rem ? rank : rem);
    *count = base + (rank < rem ? 1 : 0);
}

static long lmax(long a, long b) { return a > b ? a : b; }
static long lmin(long a, long b) { return a < b ? a : b; }

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc < 4) {
        fprintf(stderr, "usage: %s GLOBAL_N M REPS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long global_n = atol(argv[1]);
    int m = atoi(argv[2]), reps = atoi(argv[3]);
    int rank, size, other, old;
    MPI_Comm parent, inter, world = MPI_COMM_WORLD;
    if (argc > 4 && strcmp(argv[4], "static") == 0) {
        int wrank, wsize;
        MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
        MPI_Comm_size(MPI_COMM_WORLD, &wsize);
        int n_old = wsize - m;
        old = wrank < n_old;
        MPI_Comm_split(MPI_COMM_WORLD, old, wrank, &world);
        MPI_Intercomm_create(world, 0, MPI_COMM_WORLD, old ? n_old : 0, 99, &inter);
    } else {
        MPI_Comm_get_parent(&parent);
        old = parent == MPI_COMM_NULL;
        if (old)
            MPI_Comm_spawn(argv[0], argv + 1, m, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, MPI_ERRCODES_IGNORE);
        else
            inter = parent;
    }
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    MPI_Comm_remote_size(inter, &other);
    long start, count;
    block_range(rank, size, global_n, &start, &count);
    double *local = NULL;
    if (old) {
        local = malloc(count * sizeof(double));
        for (long i = 0; i < count; i++)
            local[i] = (double)(start + i);
    }
    double *times = calloc(reps + 1, sizeof(double));
    for (int r = 0; r <= reps; r++) { /* round 0 is a warm-up */
        double *mine = NULL;
        MPI_Barrier(inter);
        double t0 = MPI_Wtime();
        if (old) { /* send_state */
            for (int dst = 0; dst < other; dst++) {
                long d_start, d_count;
                block_range(dst, other, global_n, &d_start, &d_count);
                long lo = lmax(start, d_start), hi = lmin(start + count, d_start + d_count);
                if (hi > lo)
                    MPI_Send(&local[lo - start], (int)(hi - lo), MPI_DOUBLE, dst, 0, inter);
            }
        } else { /* recv_state */
            mine = malloc((count ? count : 1) * sizeof(double));
            for (int src = 0; src < other; src++) {
                long s_start, s_count;
                block_range(src, other, global_n, &s_start, &s_count);
                long lo = lmax(start, s_start), hi = lmin(start + count, s_start + s_count);
                if (hi > lo)
                    MPI_Recv(&mine[lo - start], (int)(hi - lo), MPI_DOUBLE, src, 0, inter, MPI_STATUS_IGNORE);
            }
        }
        MPI_Barrier(inter);
        times[r] = MPI_Wtime() - t0;
        if (mine) { /* checked outside the timed region */
            for (long i = 0; i < count; i++)
                if (mine[i] != (double)(start + i)) {
                    fprintf(stderr, "new rank %d: element %ld is wrong\n", rank, start + i);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            free(mine);
        }
    }
    if (old && rank == 0) {
        qsort(times + 1, reps, sizeof(double), cmp);
        printf("seconds %.6f %.6f\n", times[1], times[1 + reps / 2]);
    }
    free(local);
    free(times);
    MPI_Comm_disconnect(&inter);
    if (world != MPI_COMM_WORLD)
        MPI_Comm_free(&world);
    MPI_Finalize();
    return 0;
}
