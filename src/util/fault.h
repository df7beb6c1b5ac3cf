/* fault.h — named fault-injection points for anomaly tests (the SQLite habit).
 *
 * A test sets TANDEM_FAULT_INJECT to a comma-separated list of point names (for example
 * "atomic_write.fsync,ledger.lock"); code calls tdm_fault("atomic_write.fsync") right before the
 * real system call and treats a true answer as that call failing with EIO. Without the variable the
 * check is one getenv per call. This is a test seam, documented in docs/testing.md; it never
 * changes behaviour when unset.
 */
#ifndef TANDEM_UTIL_FAULT_H
#define TANDEM_UTIL_FAULT_H
#include <stdbool.h>

bool tdm_fault(const char *point);

#endif
