/* ledger.pml — a SPIN model of tandem's GPU ledger protocol (src/gpu/ledger.c).
 *
 * Three client processes share one GPU of capacity CAP through a ledger file. Every mutation
 * (reserve, release) follows the protocol:
 *
 *     lock -> read -> prune -> decide -> write temp (+fsync) -> rename over ledger (+fsync dir)
 *          -> unlock
 *
 * The file system is modelled as inodes with content (a bitmask of the holders recorded in the
 * file) and one directory entry, `dir_ledger` ("gpu-ledger.json"), naming an inode. rename() is a
 * single atomic step that points the entry at the temp file's inode. Each write goes to a fresh
 * inode (a temp file is never reused: process p's reserve writes inode 2+2p, its release 3+2p).
 *
 * The environment may, at any moment,
 *   - crash a live client: the kernel closes its file descriptors, so any flock it holds is
 *     released at once; its reservation stays in the ledger until some writer prunes it as dead;
 *   - expire the lease of a client that holds a reservation: writers prune it from then on.
 * A client may also give up while waiting for the lock (the bounded wait running out) and may
 * retry (wait_poll) or give up after admission was refused.
 *
 * Properties, checked in every reachable state by the `monitor` process:
 *   CAPACITY   the budgets of the LIVE holders recorded in the current ledger sum to <= CAP;
 *   NO_LOST    every client that returned success from reserve, is still alive, has not started
 *              to release and whose lease has not expired, is recorded in the current ledger;
 *   FITS       the budgets of all such clients (the ones actually using VRAM) sum to <= CAP.
 *
 * Variants (spin -D...):
 *   (default)        flock on gpu-ledger.lock, a separate file that is never renamed: all three
 *                    properties hold (contracts/check-spin.sh expects "errors: 0").
 *   LOCK_DATA_FILE   flock on the data file itself, opened before taking the lock. A waiter that
 *                    opened the old inode gets its lock after the rename, reads the stale content
 *                    through its descriptor and writes it back: an update is lost. SPIN must find
 *                    the counterexample.
 *   LOCK_DATA_FILE + ONLY_FITS   checks FITS alone: the lost update lets clients whose budgets
 *                    do not fit together both use the GPU. SPIN must find that run too.
 *   VACUITY=1..5     sanity checks that the model is not vacuous: each asserts that something the
 *                    protocol allows never happens, so SPIN must find a run where it does
 *                    (1: two clients hold at once; 2: admission is refused; 3: clients 1 and 2,
 *                    whose budgets do not fit together, both get admitted in one run; 4: a client
 *                    is admitted only because a crashed holder was pruned; 5: likewise for an
 *                    expired lease).
 *
 * What it does not model: power loss (the temp+fsync+rename+dirsync recipe in
 * src/util/atomic_file.c is what makes the rename durable), corrupt files, clocks (expiry is an
 * arbitrary event), and the VRAM query (admission here is against the ledger only).
 */

#define NP 3             /* client processes */
#define CAP 4            /* GPU capacity, in budget units */
#define NI 8             /* inodes: 0 initial ledger, 1 lock file, 2..7 temp files */
#define LOCKFILE 1       /* the inode of gpu-ledger.lock */
#define NOBODY 0         /* lk[i] value when inode i is not locked; else holder pid + 1 */

/* Budgets: client p asks for p + 1 units, so {0,1} and {0,2} fit together, {1,2} do not. */
#define BUDGET(p) ((p) + 1)
#define BIT(m, p) (((m) >> (p)) & 1)
#define SUM(m) (BIT(m, 0) * BUDGET(0) + BIT(m, 1) * BUDGET(1) + BIT(m, 2) * BUDGET(2))

byte content[NI];        /* bitmask of the holders recorded in inode i */
byte dir_ledger = 0;     /* the directory entry "gpu-ledger.json" -> inode */
byte lk[NI];             /* flock owner of inode i */
bool alive[NP] = true;   /* false once the process crashed */
bool expired[NP];        /* its lease ran out */
bool holding[NP];        /* reserve returned success and release has not started */
#ifdef VACUITY
bool ever_held[NP];      /* ghost: reserve returned success at least once */
bool denied;             /* ghost: admission refused at least once */
bool reused_dead;        /* ghost: admitted only thanks to pruning a crashed holder */
bool reused_expired;     /* ghost: admitted only thanks to pruning an expired lease */
#define GHOST(s) s
#else
#define GHOST(s) skip
#endif

/* Entries a writer prunes: holders that are dead or whose lease expired. */
#define STALE (((!alive[0] || expired[0]) << 0) | ((!alive[1] || expired[1]) << 1) | \
               ((!alive[2] || expired[2]) << 2))
#define LIVE ((alive[0] << 0) | (alive[1] << 1) | (alive[2] << 2))
#define EXPIRED ((expired[0] << 0) | (expired[1] << 1) | (expired[2] << 2))
/* Clients that believe they hold a reservation and are entitled to use it. */
#define ENTITLED (((holding[0] && alive[0] && !expired[0]) << 0) | \
                  ((holding[1] && alive[1] && !expired[1]) << 1) | \
                  ((holding[2] && alive[2] && !expired[2]) << 2))

#define CAPACITY (SUM(content[dir_ledger] & LIVE) <= CAP)
#define NO_LOST ((ENTITLED & content[dir_ledger]) == ENTITLED)
#define FITS (SUM(ENTITLED) <= CAP)

/* The inode each client holds open to lock (0 when none; inode 0 is the initial, empty ledger,
 * whose content is 0 anyway, so the overlap is harmless). */
byte fd[NP];
#define FREE_IF_UNOPENED(i) if :: (fd[0] != (i) && fd[1] != (i) && fd[2] != (i)) -> \
    content[i] = 0 :: else -> skip fi

proctype client(byte me)
{
    byte snap;           /* the ledger content it read and edits */
    byte tmp;            /* its temp file's inode */
    bool releasing = false;
#ifdef VACUITY
    byte before;         /* the content read, before pruning */
#endif

    {
        skip;                                 /* (Promela wants a statement before a label) */
mutate:
#ifdef LOCK_DATA_FILE
        /* open("gpu-ledger.json"): the descriptor keeps this inode even after a rename */
        fd[me] = dir_ledger;
#else
        /* open("gpu-ledger.lock"): a separate file that is never renamed */
        fd[me] = LOCKFILE;
#endif
        /* lock: flock(fd, LOCK_EX) with a bounded wait, which may run out while another holds it */
        if
        :: atomic { lk[fd[me]] == NOBODY -> lk[fd[me]] = me + 1 }
        :: atomic { lk[fd[me]] != NOBODY -> fd[me] = 0 }; goto done  /* return TIMEOUT */
        fi;
        /* read, prune, decide, write the temp file (+ fsync): one step, because it changes only
         * this client's locals and an inode nobody can reach yet (a crash or an expiry before it
         * or after it covers every outcome, since the prune reads alive/expired once). */
        atomic {
#ifdef LOCK_DATA_FILE
            snap = content[fd[me]];              /* read(fd): the inode it locked */
#else
            snap = content[dir_ledger];       /* open("gpu-ledger.json") + read */
#endif
#ifdef VACUITY
            before = snap;
#endif
            snap = snap & ~STALE;             /* prune dead holders and expired leases */
            if
            :: releasing ->
                snap = snap & ~(1 << me);
                tmp = 3 + 2 * me
            :: !releasing && SUM(snap) + BUDGET(me) <= CAP ->
#ifdef VACUITY
                if
                :: SUM(before) + BUDGET(me) > CAP ->
                    reused_dead = reused_dead || (before & ~LIVE) != 0;
                    reused_expired = reused_expired || (before & EXPIRED) != 0
                :: else -> skip
                fi;
                before = 0;
#endif
                snap = snap | (1 << me);
                tmp = 2 + 2 * me
            :: !releasing && SUM(snap) + BUDGET(me) > CAP ->
                GHOST(denied = true);
                lk[fd[me]] = NOBODY;             /* unlock, then wait_poll */
                fd[me] = 0;
                snap = 0;
                goto waitpoll
            fi;
            content[tmp] = snap;
            snap = 0
        };
        /* rename over gpu-ledger.json (+ fsync of the directory), then unlock and return. One step:
         * a crash between rename and unlock is a crash after unlock (the kernel drops the flock). */
        atomic {
            /* The replaced inode is freed once no descriptor refers to it: forget its content so
             * that states differing only in garbage are one state. */
            FREE_IF_UNOPENED(dir_ledger);
            dir_ledger = tmp;
            lk[fd[me]] = NOBODY;
            fd[me] = 0;
            tmp = 0;
            if
            :: releasing -> goto done
            :: else -> holding[me] = true; GHOST(ever_held[me] = true)
            fi
        };
        /* use the reservation; later release it, or keep it until the end of the run */
        if
        :: atomic { holding[me] = false; releasing = true }; goto mutate
        :: goto done
        fi;
waitpoll:
        if
        :: goto mutate                        /* poll again */
        :: goto done                          /* --no-wait-gpu or --timeout */
        fi;
done:
        skip
    } unless { !alive[me] }
}

/* Crashes and lease expiry, at any moment, any number of times (each at most once per client). */
#define CRASH(p) atomic { alive[p] -> alive[p] = false; fd[p] = 0; \
    /* the kernel releases the flock of every file the process had open */ \
    i = 0; do :: i < NI -> if :: lk[i] == (p) + 1 -> lk[i] = NOBODY :: else -> skip fi; i++ \
                 :: else -> break od; i = 0 }
#define EXPIRE(p) atomic { holding[p] && alive[p] && !expired[p] -> expired[p] = true }

active proctype environment()
{
    byte i;
    do
    :: CRASH(0)
    :: CRASH(1)
    :: CRASH(2)
    :: EXPIRE(0)
    :: EXPIRE(1)
    :: EXPIRE(2)
    :: break
    od
}

init
{
    atomic {
        run client(0);
        run client(1);
        run client(2)
    }
}

active proctype monitor()
{
#if VACUITY == 1
    end: atomic { (holding[0] && holding[1]) -> assert(!(holding[0] && holding[1])) }
#elif VACUITY == 2
    end: atomic { denied -> assert(!denied) }
#elif VACUITY == 3
    end: atomic { (ever_held[1] && ever_held[2]) -> assert(!(ever_held[1] && ever_held[2])) }
#elif VACUITY == 4
    end: atomic { reused_dead -> assert(!reused_dead) }
#elif VACUITY == 5
    end: atomic { reused_expired -> assert(!reused_expired) }
#elif defined(ONLY_FITS)
    /* With LOCK_DATA_FILE: the lost update is not only bookkeeping, clients really over-commit. */
    end: atomic { !FITS -> assert(FITS) }
#else
    end: atomic {
        !(CAPACITY && NO_LOST && FITS) ->
            assert(CAPACITY);
            assert(NO_LOST);
            assert(FITS)
    }
#endif
}
