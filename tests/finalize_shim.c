// A stand-in for MPI_Finalize, preloaded into the ranks of tests/t_72_two_nodes.sh only: MPICH
// 4.0.2 over UCX 1.13.1's TCP transport hangs in MPI_Finalize in about half of the runs with more
// than two ranks across namespaces (each rank closes its UCX endpoints in flush mode; a rank
// whose closes are done waits in the PMI barrier and stops reading its sockets, while a peer's
// close still waits for its answer). Every rank has finished its work when it calls
// MPI_Finalize: a barrier (nobody leaves before all arrive), then PMI's own finalize, so that
// Hydra's proxy sees a rank that ended as it should (not one that died, which ends the job with
// SIGKILL), then the process ends.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int MPI_Finalize(void) {
    PMPI_Barrier(MPI_COMM_WORLD);
    fflush(NULL);
    // a rank that leaves the barrier first must not close its sockets while a peer still waits
    // for the barrier's last message from it (UCX would report the closed peer as an error, and
    // the job would end `fail` after its last step): a moment for every rank to leave
    usleep(500 * 1000);
    // Hydra's PMI-1 wire: "cmd=finalize", then the ack (Slurm's PMI-2 does not ask for it)
    const char *fd_name = getenv("PMI_FD");
    if (fd_name && !getenv("SLURM_STEP_ID")) {
        int fd = atoi(fd_name);
        char ack[64];
        if (write(fd, "cmd=finalize\n", 13) == 13) (void)!read(fd, ack, sizeof ack);
    }
    _exit(0);
}
