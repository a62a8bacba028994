/* Does MSG_ZEROCOPY pay on the links this machine can host (issue 20)? Streams TOTAL
 * bytes over one TCP connection in sends of SIZE bytes, with plain send() or with
 * SO_ZEROCOPY + send(MSG_ZEROCOPY) (completions reaped from the error queue, as a
 * transport using it must), and prints `ZC <size> <0|1> <GB/s>`.
 *
 *   tcp_zerocopy server IP PORT TOTAL         (serves connections until killed)
 *   tcp_zerocopy client IP PORT TOTAL SIZE ZC
 *
 * On loopback and veth the receiving socket is on this host, and the kernel copies
 * zero-copy pages when it delivers them (skb_orphan_frags_rx): pinning and
 * notifications come on top of the same copy. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Drains the zero-copy completion notifications queued so far. */
static long reap(int fd) {
    long n = 0;
    char c[128];
    struct msghdr m = {0};
    m.msg_control = c;
    m.msg_controllen = sizeof c;
    while (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) >= 0) {
        n++;
        m.msg_controllen = sizeof c;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[1], "server") && (strcmp(argv[1], "client") || argc < 7))) {
        fprintf(stderr, "usage: %s server IP PORT TOTAL | client IP PORT TOTAL SIZE ZC\n", argv[0]);
        return 2;
    }
    size_t total = strtoull(argv[4], 0, 10);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[2]);
        return 2;
    }
    int one = 1;
    if (!strcmp(argv[1], "server")) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) {
            perror("tcp_zerocopy: bind");
            return 1;
        }
        printf("READY\n");
        fflush(stdout);
        char *b = malloc(4u << 20);
        for (;;) {
            int s = accept(l, 0, 0);
            if (s < 0) return 1;
            size_t got = 0;
            while (got < total) {
                ssize_t n = read(s, b, 4u << 20);
                if (n <= 0) break;
                got += n;
            }
            if (write(s, "k", 1) != 1) perror("tcp_zerocopy: ack");
            close(s);
        }
    }
    size_t size = strtoull(argv[5], 0, 10);
    int zc = atoi(argv[6]);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (zc && setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) {
        perror("tcp_zerocopy: SO_ZEROCOPY");
        return 1;
    }
    if (connect(s, (void *)&a, sizeof a)) {
        perror("tcp_zerocopy: connect");
        return 1;
    }
    char *buf = malloc(size);
    memset(buf, 1, size);
    double t = now();
    for (size_t sent = 0; sent < total; sent += size) {
        for (size_t off = 0; off < size;) {
            ssize_t n = send(s, buf + off, size - off, zc ? MSG_ZEROCOPY : 0);
            if (n < 0 && (errno == ENOBUFS || errno == EAGAIN)) {
                /* Too many pages pinned: wait for completions. */
                struct pollfd p = {s, POLLERR, 0};
                poll(&p, 1, 10);
                reap(s);
                continue;
            }
            if (n < 0) {
                perror("tcp_zerocopy: send");
                return 1;
            }
            off += n;
        }
        if (zc) reap(s);
    }
    char k;
    if (read(s, &k, 1) != 1) {
        fprintf(stderr, "tcp_zerocopy: no acknowledgement\n");
        return 1;
    }
    printf("ZC %zu %d %.3f\n", size, zc, total / (now() - t) / 1e9);
    return 0;
}
