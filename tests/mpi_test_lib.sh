# shellcheck shell=bash
# Sourced by the tests that run one MPI test program at several world sizes (t_42, t_43).

# run_mpi_test NAME NP...: runs $PICOTRON_BUILD/tests/NAME under `mpirun -np NP` for each NP, its
# output prefixed with np=NP. Exits 77 without mpirun and 1 without the program; returns 1 when
# a run fails.
run_mpi_test() {
    local name=$1 bin=${PICOTRON_BUILD:-build}/tests/$1 np out rc status=0
    shift
    command -v mpirun >/dev/null || { echo "mpirun not found: install mpich (make deps)"; exit 77; }
    [ -x "$bin" ] || { echo "$bin is missing: build it with make $bin"; exit 1; }
    export OMP_NUM_THREADS=1 # up to 4 ranks share the cores
    for np in "$@"; do
        out=$(timeout 60 mpirun -np "$np" "$bin" 2>&1)
        rc=$?
        echo "$out" | sed "s/^/np=$np: /"
        [ $rc -eq 0 ] || { echo "np=$np: $name exited $rc"; status=1; }
    done
    return $status
}
