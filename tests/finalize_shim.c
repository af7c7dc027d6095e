// A stand-in for MPI_Finalize, preloaded into the ranks of tests/t_72_two_nodes.sh only: MPICH
// 4.0.2 over UCX 1.13.1's TCP transport hangs in MPI_Finalize in about half of the runs with more
// than two ranks across namespaces (each rank closes its UCX endpoints in flush mode; a rank
// whose closes are done waits in the PMI barrier and stops reading its sockets, while a peer's
// close still waits for its answer). Every rank here has finished its work once it calls
// MPI_Finalize: a barrier (nobody leaves before all arrive), then the process ends.
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int MPI_Finalize(void) {
    PMPI_Barrier(MPI_COMM_WORLD);
    fflush(NULL);
    _exit(0);
}
