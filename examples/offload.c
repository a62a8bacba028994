/*
 * offload.c: a computation that hands its output to the gepsea agent.
 *
 * It computes the Collatz stopping time of 1..N in blocks. Without gepsea it would
 * compress and write each block itself; with gepsea it hands each block to the
 * node's agent (the built-in "append" plug-in), which compresses it with zstd and
 * appends it to the output file while the program computes the next block. The lines
 * marked gepsea are the whole integration.
 *
 * Build: cc offload.c -Iinclude -Ltarget/debug -lgepsea_client -o offload
 * Run:   gepsea agent &  ./offload /abs/path/results.zst 100000
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gepsea.h" /* gepsea */

#define BLOCK 256

static unsigned steps(unsigned long n) {
    unsigned s = 0;
    while (n != 1) {
        n = (n % 2 == 0) ? n / 2 : 3 * n + 1;
        s++;
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s OUTPUT.zst N\n", argv[0]);
        return 2;
    }
    const char *out = argv[1];
    unsigned long n = strtoul(argv[2], NULL, 10);
    GepseaClient *g = gepsea_connect("offload-example"); /* gepsea */
    if (!g) { /* gepsea */
        fprintf(stderr, "offload: %s\n", gepsea_last_error()); /* gepsea */
        return 1; /* gepsea */
    } /* gepsea */
    uint64_t *pending = calloc(n / BLOCK + 2, sizeof *pending); /* gepsea */
    size_t started = 0; /* gepsea */
    char *buf = malloc(BLOCK * 32);
    for (unsigned long first = 1; first <= n; first += BLOCK) {
        size_t len = 0;
        for (unsigned long i = first; i < first + BLOCK && i <= n; i++)
            len += (size_t)sprintf(buf + len, "%lu %u\n", i, steps(i));
        /* Hand the block over and go straight on computing the next one. */
        if (gepsea_append_start(g, out, 3, (const uint8_t *)buf, len, &pending[started++]) != GepseaStatus_Ok) { /* gepsea */
            fprintf(stderr, "offload: %s\n", gepsea_last_error()); /* gepsea */
            return 1; /* gepsea */
        } /* gepsea */
    }
    for (size_t i = 0; i < started; i++) /* gepsea */
        if (gepsea_wait(g, pending[i], NULL, NULL) != GepseaStatus_Ok) { /* gepsea */
            fprintf(stderr, "offload: %s\n", gepsea_last_error()); /* gepsea */
            return 1; /* gepsea */
        } /* gepsea */
    gepsea_disconnect(g); /* gepsea */
    free(pending); /* gepsea */
    free(buf);
    printf("offloaded %zu blocks of results to %s\n", started, out);
    return 0;
}
