/* Reference for `gepsea-bench net`: OpenMPI ping-pong latency and streaming bandwidth
 * between two ranks, measured the same way as gepsea's (half round trip, median of 7
 * batches; bandwidth with a window of 16 outstanding sends, acknowledged per size).
 * Each of the 16 outstanding receives has a buffer of its own: MPI forbids concurrent
 * receives into one buffer, and gepsea's sink cannot share one either; a single shared
 * receive buffer would stay in cache and flatter the reference (20 vs 14 GB/s at 1 MiB
 * on these machines).
 * Every buffer is filled with a non-zero byte before the clock starts, so its pages are
 * in memory, as gepsea-netpeer's are: GCC turns `malloc` + `memset(p, 0, n)` into
 * `calloc`, whose fresh pages then fault inside the measured streams (16 MiB of faults
 * in the 1 MiB stream, 64 MiB in the 4 MiB one: OpenMPI's 1 MiB and 4 MiB TCP streams
 * ran at 7.3 and 3.6 GB/s that way, against 8.1 and 6.0 with the pages touched). The
 * Makefile refuses a build that calls `calloc`.
 * Arguments: scale of the iteration counts, bytes per bandwidth size, and `multiple` to
 * initialise with MPI_THREAD_MULTIPLE (a thread-safe library, as gepsea-net's port is;
 * OpenMPI then takes locks on its path).
 * Prints `LAT <size> <us>` and `BW <size> <GB/s>` lines. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc > 3 && strcmp(argv[3], "multiple") == 0) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        if (provided != MPI_THREAD_MULTIPLE) {
            fprintf(stderr, "mpi_pingpong: this MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n", provided);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    } else {
        MPI_Init(&argc, &argv);
    }
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    size_t lat_sizes[] = {8, 1024, 65536, 1048576};
    size_t bw_sizes[] = {65536, 1048576, 4194304};
    size_t total = argc > 2 ? strtoull(argv[2], 0, 10) : (256u << 20);
    char *buf = malloc(4u << 20), *rbuf = malloc(4u << 20);
    memset(buf, 1, 4u << 20);
    memset(rbuf, 0x5a, 4u << 20);
    char *rbufs[16];
    for (int j = 0; j < 16; j++) {
        rbufs[j] = malloc(4u << 20);
        memset(rbufs[j], 0x5a, 4u << 20);
    }
    for (int k = 0; k < 4; k++) {
        size_t s = lat_sizes[k];
        long iters = (long)((4u << 20) / (s + 1024));
        if (iters < 50) iters = 50;
        if (iters > 20000) iters = 20000;
        iters = (long)(iters * scale);
        if (iters < 10) iters = 10;
        double b[8];
        for (int r = 0; r < 8; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            for (long i = 0; i < iters; i++) {
                if (rank == 0) {
                    MPI_Send(buf, (int)s, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                    MPI_Recv(rbuf, (int)s, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(rbuf, (int)s, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)s, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                }
            }
            b[r] = (MPI_Wtime() - t) * 1e6 / iters / 2;
        }
        qsort(b + 1, 7, sizeof(double), cmp);
        if (rank == 0) printf("LAT %zu %.3f\n", s, b[1 + 3]);
    }
    for (int k = 0; k < 3; k++) {
        size_t s = bw_sizes[k];
        long n = (long)(total / s);
        if (n < 16) n = 16;
        MPI_Request req[16];
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (long i = 0; i < n; i += 16) {
            int w = (int)(n - i < 16 ? n - i : 16);
            for (int j = 0; j < w; j++) {
                if (rank == 0) MPI_Isend(buf, (int)s, MPI_BYTE, 1, 0, MPI_COMM_WORLD, &req[j]);
                else MPI_Irecv(rbufs[j], (int)s, MPI_BYTE, 0, 0, MPI_COMM_WORLD, &req[j]);
            }
            MPI_Waitall(w, req, MPI_STATUSES_IGNORE);
        }
        char ack = 0;
        if (rank == 0) MPI_Recv(&ack, 1, MPI_BYTE, 1, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else MPI_Send(&ack, 1, MPI_BYTE, 0, 9, MPI_COMM_WORLD);
        double secs = MPI_Wtime() - t;
        if (rank == 0) printf("BW %zu %.3f\n", s, (double)(n * s) / secs / 1e9);
    }
    free(buf);
    free(rbuf);
    for (int j = 0; j < 16; j++) free(rbufs[j]);
    MPI_Finalize();
    return 0;
}
