/* tfevents.h — TensorBoard event files of an adapter (docs/tensorboard.md).
 *
 * Every process that trains an adapter writes one new file, OUT_DIR/runs/
 * events.out.tfevents.<unix seconds>.<hostname>[.<n>] (.<n> only when that name is taken), beside
 * metrics.jsonl and with the same values, so `tensorboard --logdir OUT_DIR` (or the folder above
 * several OUT_DIRs) shows the run. The file is a sequence of TFRecords:
 *
 *   uint64 length                 little-endian, bytes of data
 *   uint32 masked_crc(length)     of those 8 bytes
 *   byte   data[length]           one Event protobuf
 *   uint32 masked_crc(data)
 *
 * masked_crc(x) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2^32), c = CRC-32C of x
 * (util/crc32c.h). Of Event (tensorflow/core/util/event.proto) tandem writes the fields
 *
 *   1 wall_time    double, fixed64     seconds since the epoch
 *   2 step         int64, varint       the adapter's optimizer step
 *   3 file_version string              "brain.Event:2", alone in the first record
 *   5 summary      Summary             { repeated Value value = 1 }, Value = { string tag = 1;
 *                                      float simple_value = 2 (fixed32) }
 *   6 session_log  SessionLog          { status = 1 (enum, START = 1) }, alone in the second
 *                                      record, at the first step this process can log (the
 *                                      resumed step + 1; 1 for a fresh run)
 *
 * The SessionLog START is how TensorBoard learns of a restart: it drops the points older files
 * logged at steps >= its step (a crash after the checkpoint a resume starts from leaves such
 * orphans; metrics.jsonl is cut back to the checkpoint for the same reason). Records are appended
 * whole or not at all (util/append_file.h): a full disk ends the run with "cannot append to
 * OUT_DIR/runs/events...: No space left on device", and the file still ends with a whole record.
 */
#ifndef TANDEM_TRAIN_TFEVENTS_H
#define TANDEM_TRAIN_TFEVENTS_H
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define TDM_TFEVENTS_DIR "runs"
#define TDM_TFEVENTS_PREFIX "events.out.tfevents."
#define TDM_TFEVENTS_VERSION "brain.Event:2"

typedef struct tdm_tfevents {
    char path[4096]; /* the file, "" before tdm_tfevents_open */
} tdm_tfevents;

typedef struct tdm_tfevents_value {
    const char *tag; /* e.g. "train/loss", at most 255 bytes */
    double value;    /* written as a float; NaN: the value is left out */
} tdm_tfevents_value;

/* Removes OUT_DIR/runs/events.out.tfevents.* (a fresh start: metrics.jsonl starts empty too).
 * A missing runs/ is fine. */
tdm_status tdm_tfevents_remove(const char *out_dir, tdm_error *err);

/* Creates OUT_DIR/runs/ when missing and a new event file in it holding the file_version record
 * and a SessionLog START at start_step. */
tdm_status tdm_tfevents_open(tdm_tfevents *w, const char *out_dir, int64_t start_step,
                             tdm_error *err);

/* Appends one Event at step and wall_time with a Summary of the values that are not NaN (all
 * NaN: nothing is written). */
tdm_status tdm_tfevents_write(const tdm_tfevents *w, int64_t step, double wall_time,
                              const tdm_tfevents_value *values, int n, tdm_error *err);

/* The masked CRC-32C of TFRecord framing. */
uint32_t tdm_tfrecord_masked_crc(const void *data, size_t n);

/* Frames the n bytes of data as one TFRecord into out (n + 16 bytes); returns n + 16. */
size_t tdm_tfrecord_frame(const void *data, size_t n, unsigned char *out);

#endif
