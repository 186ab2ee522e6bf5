/* tf_translate: our SavedModel loaded and run as a model server does, through TensorFlow's C API, no Python.
 *
 *   tf_translate [options] EXPORT_DIR [SENTENCE...]
 *
 * Loads TensorFlow Text's op libraries (--op-library, a .so file or a folder of them) with
 * TF_LoadLibrary, then the SavedModel with TF_LoadSessionFromSavedModel (tag "serve"), reads the
 * signature's tensor names from the MetaGraphDef that the load returns (its signature_def map,
 * decoded here from the protobuf wire format: the C API has no protobuf parser), runs the
 * signature on the sentences (the arguments, or standard input's lines when there are none) as
 * one batch and prints one translation per line, in order.
 *
 * Options:
 *   --op-library PATH   a custom-op library to load first; a folder: every *.so in it (repeatable)
 *   --signature NAME    the signature to run (default serving_default)
 *   --beam-size N       feed the signature's beam_size input (default: the signature's default)
 *   --threads N         TensorFlow's intra- and inter-op pools (default 0: one thread per core each)
 *   --scores            print "score<TAB>translation"
 *   --quiet             print no translations (with --time)
 *   --time N            then time N calls of one sentence, each the next given sentence, after
 *                       --warmup such calls (wall p50/p99 and CPU p50, ms), and the given sentences
 *                       as one batch (--batch-runs times after a warm-up, the best: sentences/s)
 *   --warmup N          (default 3)
 *   --batch-runs N      (default 3)
 *
 * The timing lines follow the translations on standard output and start with "# ".
 * Exit status: 0 translated, 1 a TensorFlow error (its message on standard error), 2 wrong usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tensorflow/c/c_api.h"

/* The DataType values of tensorflow/core/framework/types.proto that the signatures use. */
enum { DT_FLOAT = 1, DT_INT32 = 3, DT_STRING = 7 };

#define MAX_TENSORS 8
#define MAX_LIBRARIES 64

static void die(int code, const char *what, const char *detail) {
  fprintf(stderr, "tf_translate: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(code);
}

static void check(TF_Status *status, const char *what) {
  if (TF_GetCode(status) != TF_OK) die(1, what, TF_Message(status));
}

/* ---- The protobuf wire format, as much as reading a MetaGraphDef's signature_def needs. ---- */

typedef struct {
  const uint8_t *p, *end;
} Bytes;

typedef struct {
  uint32_t field, wire;
  uint64_t varint; /* wire type 0 */
  Bytes bytes;     /* wire type 2 */
} Field;

static int read_varint(Bytes *b, uint64_t *value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
    uint8_t byte = *b->p++;
    v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *value = v;
      return 1;
    }
  }
  return 0;
}

/* The next field of a message: 1, 0 at its end; a malformed message is fatal. */
static int next_field(Bytes *b, Field *f) {
  uint64_t key, n;
  if (b->p >= b->end) return 0;
  if (!read_varint(b, &key)) die(1, "malformed MetaGraphDef", "bad key");
  f->field = (uint32_t)(key >> 3);
  f->wire = (uint32_t)(key & 7);
  switch (f->wire) {
    case 0:
      if (!read_varint(b, &f->varint)) die(1, "malformed MetaGraphDef", "bad varint");
      return 1;
    case 1:
      n = 8;
      break;
    case 5:
      n = 4;
      break;
    case 2:
      if (!read_varint(b, &n)) die(1, "malformed MetaGraphDef", "bad length");
      break;
    default:
      die(1, "malformed MetaGraphDef", "unsupported wire type");
      return 0;
  }
  if (n > (uint64_t)(b->end - b->p)) die(1, "malformed MetaGraphDef", "field past the end");
  f->bytes.p = b->p;
  f->bytes.end = b->p + n;
  b->p += n;
  return 1;
}

static int bytes_equal(Bytes b, const char *s) {
  size_t n = strlen(s);
  return (size_t)(b.end - b.p) == n && memcmp(b.p, s, n) == 0;
}

static char *bytes_dup(Bytes b) {
  size_t n = (size_t)(b.end - b.p);
  char *s = malloc(n + 1);
  if (!s) die(1, "out of memory", NULL);
  memcpy(s, b.p, n);
  s[n] = '\0';
  return s;
}

/* A map<string, Message> entry: key (field 1), value (field 2). */
static void map_entry(Bytes entry, Bytes *key, Bytes *value) {
  Field f;
  key->p = key->end = value->p = value->end = entry.p;
  while (next_field(&entry, &f)) {
    if (f.field == 1 && f.wire == 2) *key = f.bytes;
    if (f.field == 2 && f.wire == 2) *value = f.bytes;
  }
}

typedef struct {
  char *key;  /* the signature's name for it, e.g. "inputs" */
  char *name; /* the graph's, e.g. "serving_default_inputs:0" */
  int dtype;
  int has_default;
  int32_t default_int; /* SignatureDef.defaults[key], for an int32 scalar */
  TF_Output output;
} SignatureTensor;

typedef struct {
  int n_inputs, n_outputs;
  SignatureTensor inputs[MAX_TENSORS], outputs[MAX_TENSORS];
} Signature;

/* TensorInfo: name (field 1), dtype (field 2). */
static void read_tensor_info(Bytes key, Bytes info, SignatureTensor *t) {
  Field f;
  memset(t, 0, sizeof *t);
  t->key = bytes_dup(key);
  while (next_field(&info, &f)) {
    if (f.field == 1 && f.wire == 2) t->name = bytes_dup(f.bytes);
    if (f.field == 2 && f.wire == 0) t->dtype = (int)f.varint;
  }
  if (!t->name) die(1, "the signature's tensor is not a dense tensor", t->key);
}

/* TensorProto of an int32 scalar: int_val (field 7, packed or not) or tensor_content (field 4). */
static int read_int_default(Bytes tensor, int32_t *value) {
  Field f;
  int found = 0;
  while (next_field(&tensor, &f)) {
    if (f.field == 7 && f.wire == 0) {
      *value = (int32_t)f.varint;
      found = 1;
    } else if (f.field == 7 && f.wire == 2) {
      uint64_t v;
      if (read_varint(&f.bytes, &v)) {
        *value = (int32_t)v;
        found = 1;
      }
    } else if (f.field == 4 && f.wire == 2 && f.bytes.end - f.bytes.p == 4) {
      memcpy(value, f.bytes.p, 4); /* little-endian, as the machines that run this */
      found = 1;
    }
  }
  return found;
}

/* MetaGraphDef.signature_def (field 5): map<string, SignatureDef>; SignatureDef: inputs (1),
 * outputs (2), method_name (3), defaults (4). Returns 0 when the signature is not there, and then
 * fills `names` with the ones that are. */
static int read_signature(const TF_Buffer *meta_graph, const char *wanted, Signature *sig, char *names,
                          size_t names_size) {
  Bytes graph = {meta_graph->data, (const uint8_t *)meta_graph->data + meta_graph->length};
  Field f;
  names[0] = '\0';
  while (next_field(&graph, &f)) {
    if (f.field != 5 || f.wire != 2) continue;
    Bytes key, value, entry_key, entry_value;
    map_entry(f.bytes, &key, &value);
    if (!bytes_equal(key, wanted)) {
      if (key.end - key.p >= 2 && key.p[0] == '_' && key.p[1] == '_') continue; /* __saved_model_init_op */
      size_t used = strlen(names), n = (size_t)(key.end - key.p);
      if (used + n + 3 < names_size) {
        if (used) strcat(names, ", ");
        strncat(names, (const char *)key.p, n);
      }
      continue;
    }
    memset(sig, 0, sizeof *sig);
    Field g;
    Bytes def = value;
    while (next_field(&def, &g)) {
      if (g.wire != 2) continue;
      if (g.field == 1 || g.field == 2) {
        int *n = g.field == 1 ? &sig->n_inputs : &sig->n_outputs;
        SignatureTensor *list = g.field == 1 ? sig->inputs : sig->outputs;
        if (*n == MAX_TENSORS) die(1, "the signature has too many tensors", wanted);
        map_entry(g.bytes, &entry_key, &entry_value);
        read_tensor_info(entry_key, entry_value, &list[(*n)++]);
      }
    }
    def = value; /* defaults, once the inputs are known */
    while (next_field(&def, &g)) {
      if (g.field != 4 || g.wire != 2) continue;
      map_entry(g.bytes, &entry_key, &entry_value);
      for (int i = 0; i < sig->n_inputs; i++)
        if (bytes_equal(entry_key, sig->inputs[i].key))
          sig->inputs[i].has_default = read_int_default(entry_value, &sig->inputs[i].default_int);
    }
    return 1;
  }
  return 0;
}

/* "op:index" (or "op", index 0) -> the graph's TF_Output. */
static TF_Output graph_output(TF_Graph *graph, const char *name) {
  char op[512];
  const char *colon = strrchr(name, ':');
  size_t n = colon ? (size_t)(colon - name) : strlen(name);
  if (n >= sizeof op) die(1, "tensor name too long", name);
  memcpy(op, name, n);
  op[n] = '\0';
  TF_Output out = {TF_GraphOperationByName(graph, op), colon ? atoi(colon + 1) : 0};
  if (!out.oper) die(1, "the graph has no operation for the signature's tensor", name);
  return out;
}

static SignatureTensor *find(SignatureTensor *list, int n, const char *key) {
  for (int i = 0; i < n; i++)
    if (strcmp(list[i].key, key) == 0) return &list[i];
  return NULL;
}

/* ---- Op libraries ---- */

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void load_library(const char *path) {
  TF_Status *status = TF_NewStatus();
  TF_Library *library = TF_LoadLibrary(path, status);
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "tf_translate: cannot load the op library %s: %s\n", path, TF_Message(status));
    exit(1);
  }
  (void)library; /* kept loaded for the process' life: its ops are registered */
  TF_DeleteStatus(status);
}

/* A .so file, or every *.so file of a folder, in name order. */
static void load_libraries(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) die(2, "no such op library", path);
  if (!S_ISDIR(st.st_mode)) {
    load_library(path);
    return;
  }
  DIR *dir = opendir(path);
  if (!dir) die(2, "cannot read the folder", path);
  char *names[MAX_LIBRARIES];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0) {
      if (n == MAX_LIBRARIES) die(2, "too many libraries in", path);
      names[n] = malloc(strlen(path) + len + 2);
      if (!names[n]) die(1, "out of memory", NULL);
      sprintf(names[n++], "%s/%s", path, e->d_name);
    }
  }
  closedir(dir);
  if (n == 0) die(2, "no .so file in", path);
  qsort(names, (size_t)n, sizeof *names, compare_names);
  for (int i = 0; i < n; i++) {
    load_library(names[i]);
    free(names[i]);
  }
}

/* ---- Running the signature ---- */

typedef struct {
  TF_Session *session;
  Signature *sig;
  SignatureTensor *inputs, *beam, *translations, *scores;
  int beam_size; /* < 0: not fed */
} Runner;

static TF_Tensor *string_tensor(char **sentences, int n) {
  int64_t dims[1] = {n};
  TF_Tensor *t = TF_AllocateTensor(TF_STRING, dims, 1, (size_t)n * sizeof(TF_TString));
  TF_TString *data = (TF_TString *)TF_TensorData(t);
  for (int i = 0; i < n; i++) {
    TF_StringInit(&data[i]);
    TF_StringCopy(&data[i], sentences[i], strlen(sentences[i]));
  }
  return t;
}

static void delete_string_tensor(TF_Tensor *t, int n) {
  TF_TString *data = (TF_TString *)TF_TensorData(t);
  for (int i = 0; i < n; i++) TF_StringDealloc(&data[i]);
  TF_DeleteTensor(t);
}

/* Runs the signature on n sentences; out[0] translations, out[1] scores (or NULL). */
static void run(Runner *r, char **sentences, int n, TF_Tensor **out) {
  TF_Output feeds[2], fetches[2];
  TF_Tensor *values[2];
  int n_feeds = 0, n_fetches = 0;
  feeds[n_feeds] = r->inputs->output;
  values[n_feeds++] = string_tensor(sentences, n);
  if (r->beam) {
    TF_Tensor *beam = TF_AllocateTensor(TF_INT32, NULL, 0, sizeof(int32_t));
    *(int32_t *)TF_TensorData(beam) = r->beam_size;
    feeds[n_feeds] = r->beam->output;
    values[n_feeds++] = beam;
  }
  fetches[n_fetches++] = r->translations->output;
  if (r->scores) fetches[n_fetches++] = r->scores->output;
  out[1] = NULL;
  TF_Status *status = TF_NewStatus();
  TF_SessionRun(r->session, NULL, feeds, values, n_feeds, fetches, out, n_fetches, NULL, 0, NULL, status);
  check(status, "running the signature failed");
  TF_DeleteStatus(status);
  delete_string_tensor(values[0], n);
  if (r->beam) TF_DeleteTensor(values[1]);
  if (TF_TensorType(out[0]) != TF_STRING || TF_NumDims(out[0]) != 1 || TF_Dim(out[0], 0) != n)
    die(1, "the translations are not one string per sentence", NULL);
}

static void run_and_free(Runner *r, char **sentences, int n) {
  TF_Tensor *out[2];
  run(r, sentences, n, out);
  TF_DeleteTensor(out[0]);
  if (out[1]) TF_DeleteTensor(out[1]);
}

/* ---- Timing ---- */

static double seconds(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* numpy.percentile's default (linear interpolation between the closest ranks); sorts values. */
static double percentile(double *values, int n, double p) {
  qsort(values, (size_t)n, sizeof *values, compare_doubles);
  double rank = p / 100.0 * (n - 1);
  int low = (int)rank;
  if (low >= n - 1) return values[n - 1];
  return values[low] + (rank - low) * (values[low + 1] - values[low]);
}

static void time_calls(Runner *r, char **sentences, int n, int runs, int warmup, int batch_runs) {
  double *wall = malloc(sizeof(double) * (size_t)runs), *cpu = malloc(sizeof(double) * (size_t)runs);
  if (!wall || !cpu) die(1, "out of memory", NULL);
  for (int i = 0; i < warmup; i++) run_and_free(r, &sentences[i % n], 1);
  for (int i = 0; i < runs; i++) {
    double w = seconds(CLOCK_MONOTONIC), c = seconds(CLOCK_PROCESS_CPUTIME_ID);
    run_and_free(r, &sentences[i % n], 1);
    wall[i] = (seconds(CLOCK_MONOTONIC) - w) * 1000.0;
    cpu[i] = (seconds(CLOCK_PROCESS_CPUTIME_ID) - c) * 1000.0;
  }
  double p50 = percentile(wall, runs, 50), p99 = percentile(wall, runs, 99), cpu50 = percentile(cpu, runs, 50);
  printf("# one sentence: p50 %.3f ms, p99 %.3f ms, CPU p50 %.3f ms over %d calls\n", p50, p99, cpu50, runs);
  run_and_free(r, sentences, n); /* warm-up */
  double best = 0, best_cpu = 0;
  for (int i = 0; i < batch_runs; i++) {
    double w = seconds(CLOCK_MONOTONIC), c = seconds(CLOCK_PROCESS_CPUTIME_ID);
    run_and_free(r, sentences, n);
    w = seconds(CLOCK_MONOTONIC) - w;
    c = seconds(CLOCK_PROCESS_CPUTIME_ID) - c;
    if (i == 0 || w < best) best = w;
    if (i == 0 || c < best_cpu) best_cpu = c;
  }
  printf("# batch of %d: best %.6f s, %.1f sentences/s, CPU best %.6f s over %d runs\n", n, best, n / best, best_cpu,
         batch_runs);
  free(wall);
  free(cpu);
}

/* ---- Main ---- */

static char **read_lines(FILE *in, int *n) {
  size_t cap = 64, len = 0;
  char **lines = malloc(cap * sizeof *lines);
  char *line = NULL;
  size_t size = 0;
  ssize_t got;
  while ((got = getline(&line, &size, in)) != -1) {
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
    if (len == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
    if (!lines) die(1, "out of memory", NULL);
    lines[len++] = strdup(line);
  }
  free(line);
  *n = (int)len;
  return lines;
}

static int int_argument(const char *option, const char *value) {
  char *end;
  long v = value ? strtol(value, &end, 10) : 0;
  if (!value || *end || v < 0 || v > 1000000) die(2, option, "wants a number");
  return (int)v;
}

static void usage(void) {
  fputs("usage: tf_translate [--op-library PATH]... [--signature NAME] [--beam-size N] [--threads N]\n"
        "                    [--scores] [--quiet] [--time N] [--warmup N] [--batch-runs N] EXPORT_DIR [SENTENCE...]\n"
        "Translates the sentences (standard input's lines when none are given), one line each.\n",
        stderr);
  exit(2);
}

int main(int argc, char **argv) {
  const char *signature_name = "serving_default", *export_dir = NULL;
  int beam_size = -1, threads = 0, scores = 0, quiet = 0, runs = 0, warmup = 3, batch_runs = 3, i;
  for (i = 1; i < argc && argv[i][0] == '-' && argv[i][1] == '-'; i++) {
    const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(option, "--") == 0) {
      i++;
      break;
    } else if (strcmp(option, "--op-library") == 0 && value) {
      load_libraries(value);
      i++;
    } else if (strcmp(option, "--signature") == 0 && value) {
      signature_name = value;
      i++;
    } else if (strcmp(option, "--beam-size") == 0) {
      beam_size = int_argument(option, value);
      i++;
    } else if (strcmp(option, "--threads") == 0) {
      threads = int_argument(option, value);
      i++;
    } else if (strcmp(option, "--time") == 0) {
      runs = int_argument(option, value);
      i++;
    } else if (strcmp(option, "--warmup") == 0) {
      warmup = int_argument(option, value);
      i++;
    } else if (strcmp(option, "--batch-runs") == 0) {
      batch_runs = int_argument(option, value);
      i++;
    } else if (strcmp(option, "--scores") == 0) {
      scores = 1;
    } else if (strcmp(option, "--quiet") == 0) {
      quiet = 1;
    } else {
      usage();
    }
  }
  if (i >= argc) usage();
  export_dir = argv[i++];
  int n = argc - i;
  char **sentences = argv + i;
  if (n == 0) sentences = read_lines(stdin, &n);
  if (n == 0) die(2, "no sentence to translate", NULL);
  if (runs > 0 && batch_runs < 1) die(2, "--batch-runs", "must be at least 1");

  TF_Status *status = TF_NewStatus();
  TF_SessionOptions *options = TF_NewSessionOptions();
  if (threads > 0) {
    /* ConfigProto: intra_op_parallelism_threads (field 2), inter_op_parallelism_threads (field 5). */
    uint8_t config[] = {0x10, 0, 0x28, 0};
    if (threads > 127) die(2, "--threads", "at most 127");
    config[1] = config[3] = (uint8_t)threads;
    TF_SetConfig(options, config, sizeof config, status);
    check(status, "setting the thread pools failed");
  }
  TF_Graph *graph = TF_NewGraph();
  TF_Buffer *meta_graph = TF_NewBuffer();
  const char *tags[] = {"serve"};
  TF_Session *session = TF_LoadSessionFromSavedModel(options, NULL, export_dir, tags, 1, graph, meta_graph, status);
  check(status, "loading the SavedModel failed");

  Signature sig;
  char names[1024];
  if (!read_signature(meta_graph, signature_name, &sig, names, sizeof names)) {
    fprintf(stderr, "tf_translate: the SavedModel has no signature %s (it has: %s)\n", signature_name, names);
    return 2;
  }
  Runner r = {session, &sig, find(sig.inputs, sig.n_inputs, "inputs"), find(sig.inputs, sig.n_inputs, "beam_size"),
              find(sig.outputs, sig.n_outputs, "translations"), find(sig.outputs, sig.n_outputs, "scores"), beam_size};
  if (!r.inputs || r.inputs->dtype != DT_STRING) die(2, "the signature takes no string tensor \"inputs\"", NULL);
  if (!r.translations || r.translations->dtype != DT_STRING)
    die(2, "the signature gives no string tensor \"translations\"", NULL);
  if (r.scores && r.scores->dtype != DT_FLOAT) r.scores = NULL;
  if (sig.n_inputs != 1 + (r.beam != NULL)) die(2, "the signature takes inputs other than inputs and beam_size", NULL);
  if (r.beam) {
    if (r.beam->dtype != DT_INT32) die(2, "the signature's beam_size is not int32", NULL);
    if (beam_size < 0 && !r.beam->has_default) die(2, "the signature's beam_size has no default", "give --beam-size");
    if (beam_size < 0) r.beam_size = r.beam->default_int;
  } else if (beam_size >= 0) {
    die(2, "--beam-size: the signature takes no beam_size", signature_name);
  }
  r.inputs->output = graph_output(graph, r.inputs->name);
  if (r.beam) r.beam->output = graph_output(graph, r.beam->name);
  r.translations->output = graph_output(graph, r.translations->name);
  if (r.scores) r.scores->output = graph_output(graph, r.scores->name);

  TF_Tensor *out[2];
  run(&r, sentences, n, out);
  if (!quiet) {
    TF_TString *translations = (TF_TString *)TF_TensorData(out[0]);
    const float *score = out[1] ? (const float *)TF_TensorData(out[1]) : NULL;
    for (int k = 0; k < n; k++) {
      if (scores && score) printf("%.6f\t", score[k]);
      fwrite(TF_StringGetDataPointer(&translations[k]), 1, TF_StringGetSize(&translations[k]), stdout);
      putchar('\n');
    }
    fflush(stdout);
  }
  TF_DeleteTensor(out[0]);
  if (out[1]) TF_DeleteTensor(out[1]);
  if (runs > 0) time_calls(&r, sentences, n, runs, warmup, batch_runs);

  TF_CloseSession(session, status);
  check(status, "closing the session failed");
  TF_DeleteSession(session, status);
  TF_DeleteBuffer(meta_graph);
  TF_DeleteGraph(graph);
  TF_DeleteSessionOptions(options);
  TF_DeleteStatus(status);
  return 0;
}
