/* MPI_Init + MPI_Finalize only: the start-up peer of `fmxrun -n 2 hello`. */
#include <mpi.h>
int main(int argc, char **argv) { MPI_Init(&argc, &argv); MPI_Finalize(); return 0; }
