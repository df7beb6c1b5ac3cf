/* corpus_replay.h — for cmocka tests: replays a committed fuzz corpus in the normal build, so fuzz
 * findings stay fixed. Include after <cmocka.h>; the test needs TANDEM_SOURCE_DIR (every unit test
 * gets it from tests/CMakeLists.txt). */
#ifndef TANDEM_TESTS_CORPUS_REPLAY_H
#define TANDEM_TESTS_CORPUS_REPLAY_H
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/atomic_file.h"

/* Runs every file of tests/fuzz/corpus/NAME/ through fn (a fuzz target's body, which aborts when
 * one of its checks fails); returns how many files there were. A missing directory or an
 * unreadable file fails the test. */
static int tdm_replay_corpus(const char *name, int (*fn)(const uint8_t *, size_t))
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", TANDEM_SOURCE_DIR, name);
    DIR *d = opendir(dir);
    if (!d)
        fail_msg("cannot open the corpus %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *buf;
        size_t len;
        tdm_error err = {0};
        if (tdm_read_file(path, &buf, &len, &err) != TDM_OK)
            fail_msg("%s", err.message);
        fn((const uint8_t *)buf, len);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

#endif
