/* output_claim.c — see output_claim.h. */
#include "run/output_claim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/ledger.h"
#include "util/path_identity.h"
#include "util/sha256.h"
#include "util/timeutil.h"

#define REGISTRY_DIR "outputs"
#define REGISTRY_LOCK ".registry.lock"
#define CLAIM_SUFFIX ".claim"
#define CLAIM_GRACE_MS 3000

/* A claim file's content: "PID\tRESOLVED_PATH\n". */
typedef struct claim_line {
    char pid[32];
    char path[TDM_PATH_IDENTITY_MAX];
} claim_line;

static bool read_claim(int fd, claim_line *l)
{
    char buf[sizeof l->pid + sizeof l->path + 4];
    ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
    if (k <= 0) return false;
    buf[k] = '\0';
    char *tab = strchr(buf, '\t'), *nl = strrchr(buf, '\n');
    if (!tab || !nl || nl < tab || (size_t)(tab - buf) >= sizeof l->pid) return false;
    *tab = *nl = '\0';
    size_t pl = (size_t)(tab - buf), ql = strlen(tab + 1);
    if (ql >= sizeof l->path) return false;
    memcpy(l->pid, buf, pl + 1);
    memcpy(l->path, tab + 1, ql + 1);
    return true;
}

/* Whether fd is still the file at path (not removed by the releasing claimant meanwhile). */
static bool same_file(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Compares the resolved OUT_DIR res with every held claim of the registry (stale ones are
 * removed). Called under the registry lock. */
static tdm_status check_registry(const char *reg, const char *given, const char *res,
                                 tdm_error *err)
{
    DIR *d = opendir(reg);
    if (!d) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot read %s", reg);
    tdm_status st = TDM_OK;
    struct dirent *e;
    char path[8192];
    while (st == TDM_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name), sl = strlen(CLAIM_SUFFIX);
        if (len <= sl || strcmp(e->d_name + len - sl, CLAIM_SUFFIX)) continue;
        snprintf(path, sizeof path, "%s/%s", reg, e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        claim_line l;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) { /* nobody holds it: left by a killed run */
            if (same_file(fd, path)) unlink(path);
        } else if (errno == EWOULDBLOCK && read_claim(fd, &l)) {
            if (!strcmp(l.path, res))
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "OUT_DIR %s is being written by another tandem finetune (pid %s): "
                              "give this adapter another OUT_DIR, or wait until that run ends "
                              "(then --resume continues from its checkpoints)",
                              given, l.pid);
            else if (tdm_path_within(res, l.path))
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "OUT_DIR %s lies inside %s, the OUT_DIR of a running tandem "
                              "finetune (pid %s), which would overwrite or remove it: give this "
                              "adapter a directory outside it",
                              given, l.path, l.pid);
            else if (tdm_path_within(l.path, res))
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "OUT_DIR %s holds %s, the OUT_DIR of a running tandem finetune "
                              "(pid %s), which this run would overwrite or remove: give this "
                              "adapter a directory that does not contain it",
                              given, l.path, l.pid);
        }
        close(fd);
    }
    closedir(d);
    return st;
}

/* The mode of the registry's files: 0660 in a group-writable ledger directory (several users
 * share it: each must see the others' claims), else 0600; set with fchmod, past the umask. */
static int open_registry_file(const char *reg, const char *path)
{
    struct stat sb;
    mode_t mode = stat(reg, &sb) == 0 && (sb.st_mode & S_IWGRP) ? 0660 : 0600;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & mode) != mode)
        (void)fchmod(fd, (sb.st_mode & 0777) | mode);
    return fd;
}

/* Creates and locks the claim of res into c->fd[a] / c->path[a]. Under the registry lock. */
static tdm_status take_one(tdm_output_claims *c, int a, const char *reg, const char *given,
                           const char *res, tdm_error *err)
{
    uint8_t dg[TDM_SHA256_DIGEST_LEN];
    tdm_sha256_buf(res, strlen(res), dg);
    char name[2 * 16 + 1];
    for (int i = 0; i < 16; i++)
        snprintf(name + 2 * i, 3, "%02x", dg[i]);
    char path[8192];
    snprintf(path, sizeof path, "%s/%s%s", reg, name, CLAIM_SUFFIX);
    for (int tries = 0; tries < 100; tries++) {
        int fd = open_registry_file(reg, path);
        if (fd < 0) return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create %s", path);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) { /* check_registry saw it free: a race lost */
            int e = errno;
            close(fd);
            if (e != EWOULDBLOCK) return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot lock %s", path);
            return tdm_fail(err, TDM_ERR_INVALID,
                            "OUT_DIR %s is being written by another tandem finetune: give this "
                            "adapter another OUT_DIR, or wait until that run ends",
                            given);
        }
        if (!same_file(fd, path)) { /* removed by its releasing claimant: open the new one */
            close(fd);
            continue;
        }
        char line[sizeof(claim_line) + 4];
        int len = snprintf(line, sizeof line, "%ld\t%s\n", (long)getpid(), res);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
            int e = errno;
            unlink(path);
            close(fd);
            return tdm_fail_errno(err, TDM_ERR_IO, e, "cannot write %s", path);
        }
        c->fd[a] = fd;
        if (!(c->path[a] = strdup(path))) return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
        return TDM_OK;
    }
    return tdm_fail(err, TDM_ERR_IO, "cannot lock %s: it keeps being replaced", path);
}

/* The registry directory (created with the ledger directory's permission bits) into reg. */
static tdm_status open_registry(char *reg, size_t cap, tdm_error *err)
{
    tdm_ledger ledger;
    TDM_TRY(tdm_ledger_open(&ledger, NULL, err));
    struct stat sb;
    mode_t mode = stat(ledger.dir, &sb) == 0 ? (sb.st_mode & 0777) : 0700;
    if (snprintf(reg, cap, "%s/%s", ledger.dir, REGISTRY_DIR) >= (int)cap)
        return tdm_fail(err, TDM_ERR_INVALID, "ledger directory path is too long");
    if (mkdir(reg, mode) != 0 && errno != EEXIST)
        return tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot create %s", reg);
    if (lstat(reg, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return tdm_fail(err, TDM_ERR_INVALID, "%s is not a directory", reg);
    return TDM_OK;
}

/* Unlocks and removes every claim taken (each only if still ours, removed while still held);
 * the arrays stay, every fd -1. */
static void drop_claims(tdm_output_claims *c)
{
    for (int a = 0; a < c->n; a++) {
        if (c->fd && c->fd[a] >= 0) {
            if (c->path && c->path[a] && same_file(c->fd[a], c->path[a])) unlink(c->path[a]);
            close(c->fd[a]);
            c->fd[a] = -1;
        }
        if (c->path) {
            free(c->path[a]);
            c->path[a] = NULL;
        }
    }
}

tdm_status tdm_output_claims_take(tdm_output_claims *c, const tdm_trainer_adapter *ads, int n,
                                  tdm_error *err)
{
    memset(c, 0, sizeof *c);
    size_t cnt = (size_t)(n > 0 ? n : 1);
    char(*res)[TDM_PATH_IDENTITY_MAX] = malloc(cnt * sizeof *res);
    c->fd = malloc(cnt * sizeof *c->fd);
    c->path = calloc(cnt, sizeof *c->path);
    if (!res || !c->fd || !c->path) {
        free(res);
        tdm_output_claims_release(c);
        return tdm_fail(err, TDM_ERR_NOMEM, "out of memory");
    }
    c->n = n;
    for (int a = 0; a < n; a++)
        c->fd[a] = -1;
    tdm_status st = TDM_OK;
    for (int a = 0; st == TDM_OK && a < n; a++)
        st = tdm_path_resolve(NULL, ads[a].output, res[a], sizeof res[a], err);
    for (int a = 0; st == TDM_OK && a < n; a++)
        for (int b = 0; st == TDM_OK && b < n; b++)
            if (tdm_path_within(res[a], res[b]))
                st = tdm_fail(err, TDM_ERR_INVALID,
                              "adapter #%d's OUT_DIR %s lies inside adapter #%d's OUT_DIR %s, "
                              "whose best/ and checkpoints would overwrite or remove it: give "
                              "each adapter a directory outside the others'",
                              a + 1, ads[a].output, b + 1, ads[b].output);
    char reg[4200];
    if (st == TDM_OK) {
        tdm_error e = {0};
        if (open_registry(reg, sizeof reg, &e) != TDM_OK) {
            tdm_warn("cannot check that no other finetune writes these OUT_DIRs: %s", e.message);
            free(res);
            return TDM_OK; /* nothing claimed: c->fd all -1 */
        }
    }
    /* A conflict is checked again for CLAIM_GRACE_MS before it is refused: a process that was
     * just killed (kill -9, then --resume at once) holds its lock until the kernel closes its
     * files, which comes after its address space is torn down (long under ASan). */
    int64_t deadline = tdm_now_mono_ns() + (int64_t)CLAIM_GRACE_MS * 1000000;
    while (st == TDM_OK) {
        int lock = -1;
        char lp[4300];
        snprintf(lp, sizeof lp, "%s/%s", reg, REGISTRY_LOCK);
        lock = open_registry_file(reg, lp);
        if (lock < 0 || flock(lock, LOCK_EX) != 0) /* held for microseconds by others */
            st = tdm_fail_errno(err, TDM_ERR_IO, errno, "cannot lock %s", lp);
        for (int a = 0; st == TDM_OK && a < n; a++) {
            st = check_registry(reg, ads[a].output, res[a], err);
            if (st == TDM_OK) st = take_one(c, a, reg, ads[a].output, res[a], err);
        }
        if (lock >= 0) close(lock); /* releases the registry lock */
        if (st != TDM_ERR_INVALID || tdm_now_mono_ns() > deadline) break;
        drop_claims(c); /* the ones taken this round, then again */
        tdm_sleep_ms(50);
        st = TDM_OK;
    }
    free(res);
    if (st != TDM_OK) tdm_output_claims_release(c);
    return st;
}

void tdm_output_claims_release(tdm_output_claims *c)
{
    if (!c) return;
    drop_claims(c);
    free(c->fd);
    free(c->path);
    memset(c, 0, sizeof *c);
}
