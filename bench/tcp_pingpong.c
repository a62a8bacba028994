/* Reference for `gepsea-bench net`: raw TCP (blocking sockets, TCP_NODELAY) ping-pong
 * latency and 1 MiB-write streaming bandwidth, the floor any TCP messaging layer pays.
 *   tcp_pingpong server ADDR PORT SCALE (serves one client, then exits)
 *   tcp_pingpong client ADDR PORT SCALE
 * The client prints `LAT <size> <us>` (half round trip, median of 7 batches) and
 * `BW <size> <GB/s>`, like gepsea-netpeer and mpi_pingpong. The buffer is filled with a
 * non-zero byte first (see mpi_pingpong.c: a zeroed one would be `calloc`'s, its pages
 * faulting inside the measurements). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void full(int fd, char *b, size_t n, int rd) {
    while (n) {
        ssize_t k = rd ? read(fd, b, n) : write(fd, b, n);
        if (k <= 0) { perror(rd ? "read" : "write"); exit(1); }
        b += k; n -= (size_t)k;
    }
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static const size_t LAT[] = {8, 1024, 65536, 1048576}, BWS[] = {65536, 1048576, 4194304};

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s server|client ADDR PORT [SCALE] (same SCALE on both sides)\n", argv[0]); return 2; }
    int server = !strcmp(argv[1], "server");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    int one = 1, fd;
    if (server) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) { perror("bind"); return 1; }
        printf("READY\n"); fflush(stdout);
        fd = accept(l, 0, 0);
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        for (int i = 0; connect(fd, (void *)&a, sizeof a); i++) {
            if (i > 200) { perror("connect"); return 1; }
            usleep(10000);
            close(fd); fd = socket(AF_INET, SOCK_STREAM, 0);
        }
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double scale = argc > 4 ? atof(argv[4]) : 1.0;
    char *buf = malloc(4u << 20);
    memset(buf, 0x5a, 4u << 20);
    for (int k = 0; k < 4; k++) {
        size_t s = LAT[k];
        long iters = (long)((4u << 20) / (s + 1024));
        iters = iters < 50 ? 50 : iters > 20000 ? 20000 : iters;
        iters = (long)(iters * scale) < 10 ? 10 : (long)(iters * scale);
        double b[8];
        for (int r = 0; r < 8; r++) {
            double t = now();
            for (long i = 0; i < iters; i++) {
                if (server) { full(fd, buf, s, 1); full(fd, buf, s, 0); }
                else { full(fd, buf, s, 0); full(fd, buf, s, 1); }
            }
            b[r] = (now() - t) * 1e6 / iters / 2;
        }
        qsort(b + 1, 7, sizeof(double), cmp);
        if (!server) printf("LAT %zu %.3f\n", s, b[4]);
    }
    size_t total = 256u << 20;
    for (int k = 0; k < 3; k++) {
        size_t s = BWS[k];
        long n = (long)(total / s);
        double t = now();
        for (long i = 0; i < n; i++) full(fd, buf, s, server);
        char ack = 0;
        if (server) full(fd, &ack, 1, 0); else full(fd, &ack, 1, 1);
        if (!server) printf("BW %zu %.3f\n", s, (double)(n * s) / (now() - t) / 1e9);
    }
    printf("OK\n");
    return 0;
}
