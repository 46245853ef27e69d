/* mqttload: a single-threaded epoll MQTT 3.1.1/5.0 load generator, fast enough not to be the bottleneck.
 *
 * Modes (one JSON line per run on stdout; idle prints an "up" line, then a "done" line when released):
 *   connect  N connections, C in flight: socket, connect, CONNECT (clean), CONNACK, DISCONNECT, wait for the
 *            server to close (--no-wait-close: close at once); connects/s and socket()->CONNACK latency.
 *   idle     open N connections (keepalive 600) with C in flight, print "up", hold them until stdin reaches
 *            EOF, SIGINT/SIGTERM, --hold seconds or the global deadline; then print "done" (dropped count).
 *   latency  one subscriber and one publisher (QoS 1 both ways by default); publish at R msgs/s for S s with
 *            the send time in the payload; end-to-end latency in us, lost and duplicate counts.
 *   fanin    N publishers (-n, default 10) to one subscriber of `<topic>/+`, closed loop: each publisher keeps
 *            --window W (default 100) QoS 1 publishes unacknowledged for S s (QoS 0: W per read turn); msgs/s
 *            the subscriber received while publishing, end-to-end latency, lost and duplicate counts.
 *            --sub-port: the subscriber (latency and fanin) connects to this port instead (another node).
 *            --qos 2 (fanin only): PUBREC/PUBREL/PUBCOMP both ways, a publish in the window until PUBCOMP.
 *            --persistent: CONNECT with clean session 0 (5.0: clean start 0, session expiry 3600 s).
 * Build: cc -O2 -std=c99 -o mqttload mqttload.c (Linux only: epoll, timerfd). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { ST_FREE, ST_CONNECTING, ST_WAIT_CONNACK, ST_WAIT_SUBACK, ST_READY, ST_WAIT_CLOSE };
enum { K_SLOT = 1, K_HELD, K_STDIN, K_TIMER };       /* epoll tag: kind << 32 | index */
enum { E_CONNECT, E_RESET, E_REFUSED, E_PROTOCOL, E_TIMEOUT, E_KINDS };
static const char *E_NAMES[E_KINDS] = {"connect", "reset", "refused", "protocol", "timeout"};
#define MAX_PACKET (1 << 20)          /* largest packet accepted from the server */
#define IO_CHUNK 65536
#define MAX_INFLIGHT 65000            /* unacked QoS 1 publishes; packet ids must stay unique */
#define HDR 16                        /* payload header: send time ns, sequence number */
#define CLOSE_WAIT_NS 1000000000ull   /* after DISCONNECT, how long the server may take to close */

typedef struct {
  int fd, state, id;                  /* id: the attempt number, for a unique client id */
  uint64_t t0;                        /* ns: socket() or the last state change, for timeouts and latency */
  unsigned char *in; size_t in_len, in_cap;
  unsigned char *out; size_t out_len, out_cap;
  int want_out;
} Conn;

typedef struct {
  const char *mode, *host, *prefix, *topic;
  int port, sub_port, n, conc, v5, keepalive, qos, payload, wait_close, window, persistent;   /* sub_port 0: --port */
  double rate, seconds, timeout, conn_timeout, drain, hold;
} Opts;

typedef struct {
  Opts o; int ep; struct sockaddr_in addr, sub_addr; uint64_t start, deadline;
  Conn *slots; int started, done, ok;
  uint64_t *lat; size_t nlat, cap_lat;
  long err[E_KINDS]; char first_err[96];
  int *held; int nheld, dropped, slow_closes, stdin_eof;
  /* latency mode */
  Conn sub, pub; int tfd; long sent, acked, uniq, dup; unsigned char *seen; long inflight, skipped;
  uint64_t pub_end, pub_stop; long cap; int pub_done;
  /* fanin mode */
  Conn *pubs; long *pub_sent, *pub_inflight, *expect; long in_window, gaps; int window, ready;
} Run;

static volatile sig_atomic_t g_stop = 0;      /* the one global: a signal handler can reach nothing else */
static void on_signal(int s) { (void)s; g_stop = 1; }

static uint64_t now_ns(void) {
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) { fprintf(stderr, "mqttload: out of memory\n"); exit(3); }
  return q;
}
static void fail(Run *r, int kind, const char *what) {
  r->err[kind]++;
  if (!r->first_err[0]) snprintf(r->first_err, sizeof r->first_err, "%s: %s", E_NAMES[kind], what);
}

/* ---- MQTT encoding ---- */
static size_t put_varint(unsigned char *p, size_t v) {
  size_t i = 0;
  do { unsigned char b = v & 0x7f; v >>= 7; p[i++] = b | (v ? 0x80 : 0); } while (v);
  return i;
}
static size_t put_str(unsigned char *p, const char *s, size_t n) {
  p[0] = (unsigned char)(n >> 8); p[1] = (unsigned char)n; memcpy(p + 2, s, n); return n + 2;
}
/* Frames body[0..blen) behind a fixed header into out; returns the packet length. */
static size_t frame(unsigned char *out, unsigned char first, const unsigned char *body, size_t blen) {
  size_t i = 0; out[i++] = first; i += put_varint(out + i, blen); memcpy(out + i, body, blen); return i + blen;
}
static size_t connect_pkt(unsigned char *out, const Opts *o, const char *cid) {
  unsigned char b[512]; size_t i = 0, n = strlen(cid);
  if (n > 400) n = 400;
  i += put_str(b, "MQTT", 4);
  b[i++] = o->v5 ? 5 : 4; b[i++] = o->persistent ? 0x00 : 0x02;   /* clean session / clean start */
  b[i++] = (unsigned char)(o->keepalive >> 8); b[i++] = (unsigned char)o->keepalive;
  if (o->v5 && o->persistent) { b[i++] = 5; b[i++] = 0x11; b[i++] = 0; b[i++] = 0; b[i++] = 0x0e; b[i++] = 0x10; }  /* expiry 3600 s */
  else if (o->v5) b[i++] = 0;                         /* no properties */
  i += put_str(b + i, cid, n);
  return frame(out, 0x10, b, i);
}

/* ---- connection I/O ---- */
static void conn_close(Run *r, Conn *c) {
  if (c->fd >= 0) { epoll_ctl(r->ep, EPOLL_CTL_DEL, c->fd, NULL); close(c->fd); }
  c->fd = -1; c->state = ST_FREE; c->in_len = 0; c->out_len = 0; c->want_out = 0;
}
static int conn_events(Run *r, Conn *c, uint64_t tag, int op) {
  struct epoll_event ev = {.events = EPOLLIN | (c->want_out ? EPOLLOUT : 0), .data.u64 = tag};
  if (c->state == ST_CONNECTING) ev.events = EPOLLOUT;
  return epoll_ctl(r->ep, op, c->fd, &ev);
}
/* Queues bytes and writes what the socket takes; the rest goes out on EPOLLOUT. -1 on a dead socket. */
static int conn_send(Run *r, Conn *c, uint64_t tag, const unsigned char *p, size_t n) {
  if (c->out_len == 0) {
    ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (w > 0) { p += w; n -= (size_t)w; }
    if (n == 0) return 0;
  }
  if (c->out_len + n > c->out_cap) { c->out_cap = (c->out_len + n) * 2; c->out = xrealloc(c->out, c->out_cap); }
  memcpy(c->out + c->out_len, p, n); c->out_len += n;
  if (!c->want_out) { c->want_out = 1; conn_events(r, c, tag, EPOLL_CTL_MOD); }
  return 0;
}
static int conn_flush(Run *r, Conn *c, uint64_t tag) {
  ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
  if (w < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  memmove(c->out, c->out + w, c->out_len - (size_t)w); c->out_len -= (size_t)w;
  if (c->out_len == 0) { c->want_out = 0; conn_events(r, c, tag, EPOLL_CTL_MOD); }
  return 0;
}
/* Queues bytes without a syscall; `conn_push` sends what is queued (fanin: one send per read turn, not per packet). */
static void conn_queue(Conn *c, const unsigned char *p, size_t n) {
  if (c->out_len + n > c->out_cap) { c->out_cap = (c->out_len + n) * 2; c->out = xrealloc(c->out, c->out_cap); }
  memcpy(c->out + c->out_len, p, n); c->out_len += n;
}
static int conn_push(Run *r, Conn *c, uint64_t tag) {
  if (!c->out_len || c->want_out) return 0;        /* nothing queued, or EPOLLOUT will send it */
  ssize_t w = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL);
  if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
  if (w > 0) { memmove(c->out, c->out + w, c->out_len - (size_t)w); c->out_len -= (size_t)w; }
  if (c->out_len) { c->want_out = 1; conn_events(r, c, tag, EPOLL_CTL_MOD); }
  return 0;
}
/* Reads what is there; 1 when the peer closed or reset, -1 on a buffer overflow, else 0. */
static int conn_read(Conn *c) {
  for (;;) {
    if (c->in_cap - c->in_len < IO_CHUNK / 4) {
      if (c->in_cap >= MAX_PACKET + 16) return -1;
      c->in_cap = c->in_cap ? c->in_cap * 2 : 512; c->in = xrealloc(c->in, c->in_cap);
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n > 0) { c->in_len += (size_t)n; if (c->in_len < c->in_cap) return 0; continue; }
    if (n == 0) return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == EINTR) continue;
    return 1;
  }
}
/* Next whole packet at c->in + off: 1 with first byte, body, body length and total length set; 0 if incomplete;
 * -1 if malformed. */
static int next_packet(Conn *c, size_t off, unsigned char *first, unsigned char **body, size_t *blen,
                       size_t *total) {
  size_t avail = c->in_len - off, len = 0, i;
  unsigned mult = 1;
  if (avail < 2) return 0;
  for (i = 1; ; i++) {
    if (i > 4) return -1;                              /* remaining length is at most 4 bytes */
    if (i >= avail) return 0;
    unsigned char b = c->in[off + i];
    len += (size_t)(b & 0x7f) * mult; mult <<= 7;
    if (!(b & 0x80)) break;
  }
  if (len > MAX_PACKET) return -1;
  if (avail < i + 1 + len) return 0;
  *first = c->in[off]; *body = c->in + off + i + 1; *blen = len; *total = i + 1 + len;
  return 1;
}
static int tcp_open(Run *r, Conn *c, uint64_t tag) {
  c->t0 = now_ns();
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) { fail(r, E_CONNECT, strerror(errno)); return -1; }
  int one = 1; setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in *to = c == &r->sub ? &r->sub_addr : &r->addr;   /* fanin: the subscriber may be on another node */
  if (connect(c->fd, (struct sockaddr *)to, sizeof *to) < 0 && errno != EINPROGRESS) {
    fail(r, E_CONNECT, strerror(errno)); close(c->fd); c->fd = -1; return -1;
  }
  c->state = ST_CONNECTING; c->want_out = 0;
  if (conn_events(r, c, tag, EPOLL_CTL_ADD) < 0) { fail(r, E_CONNECT, strerror(errno)); conn_close(r, c); return -1; }
  return 0;
}
/* After EPOLLOUT on a connecting socket: send CONNECT. */
static int tcp_connected(Run *r, Conn *c, uint64_t tag, const char *cid) {
  int err = 0; socklen_t el = sizeof err;
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
  if (err) { fail(r, E_CONNECT, strerror(err)); return -1; }
  unsigned char pkt[600]; size_t n = connect_pkt(pkt, &r->o, cid);
  c->state = ST_WAIT_CONNACK; conn_events(r, c, tag, EPOLL_CTL_MOD);
  if (conn_send(r, c, tag, pkt, n) < 0) { fail(r, E_RESET, "send CONNECT"); return -1; }
  return 0;
}
/* CONNACK body check: 0 accepted, else the error kind already counted. */
static int check_connack(Run *r, unsigned char first, const unsigned char *b, size_t blen) {
  if (first != 0x20 || blen < 2) { fail(r, E_PROTOCOL, "expected CONNACK"); return -1; }
  if (b[1] != 0) { char m[32]; snprintf(m, sizeof m, "CONNACK code %u", b[1]); fail(r, E_REFUSED, m); return -1; }
  return 0;
}
static void add_lat(Run *r, uint64_t v) {
  if (r->nlat == r->cap_lat) { r->cap_lat = r->cap_lat ? r->cap_lat * 2 : 4096; r->lat = xrealloc(r->lat, r->cap_lat * 8); }
  r->lat[r->nlat++] = v;
}

/* ---- connect / idle ---- */
static void slot_start(Run *r, int i) {
  Conn *c = &r->slots[i];
  while (r->started < r->o.n && !g_stop) {
    c->id = r->started++;
    if (tcp_open(r, c, (uint64_t)K_SLOT << 32 | (unsigned)i) == 0) return;
    r->done++;
  }
  c->state = ST_FREE;
}
static void slot_finish(Run *r, int i, int ok) {
  Conn *c = &r->slots[i];
  if (c->fd >= 0 && !(ok && !strcmp(r->o.mode, "idle"))) conn_close(r, c);
  c->fd = -1; c->state = ST_FREE; c->in_len = c->out_len = 0; c->want_out = 0;
  r->done++; slot_start(r, i);
}
static void slot_event(Run *r, int i, uint32_t ev) {
  Conn *c = &r->slots[i]; uint64_t tag = (uint64_t)K_SLOT << 32 | (unsigned)i;
  if (c->state == ST_CONNECTING) {
    char cid[128]; snprintf(cid, sizeof cid, "%s-%d", r->o.prefix, c->id);
    if (tcp_connected(r, c, tag, cid) < 0) slot_finish(r, i, 0);
    return;
  }
  if ((ev & EPOLLOUT) && c->out_len && conn_flush(r, c, tag) < 0) { fail(r, E_RESET, "send"); slot_finish(r, i, 0); return; }
  if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  int rc = conn_read(c);
  if (c->state == ST_WAIT_CLOSE) {                     /* anything but EOF is ignored: we are leaving */
    c->in_len = 0;
    if (rc != 0) slot_finish(r, i, 1);
    return;
  }
  unsigned char first, *body; size_t blen, total;
  int p = next_packet(c, 0, &first, &body, &blen, &total);
  if (p == 0 && rc == 0) return;
  if (p <= 0) { fail(r, p < 0 || rc < 0 ? E_PROTOCOL : E_RESET, p < 0 ? "bad packet" : "closed before CONNACK"); slot_finish(r, i, 0); return; }
  if (check_connack(r, first, body, blen) < 0) { slot_finish(r, i, 0); return; }
  add_lat(r, now_ns() - c->t0); r->ok++; c->in_len = 0;
  if (!strcmp(r->o.mode, "idle")) {
    r->held[r->nheld] = c->fd;
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = (uint64_t)K_HELD << 32 | (unsigned)r->nheld};
    epoll_ctl(r->ep, EPOLL_CTL_MOD, c->fd, &e); r->nheld++;
    c->fd = -1; slot_finish(r, i, 1); return;
  }
  static const unsigned char disc[2] = {0xe0, 0x00};
  if (conn_send(r, c, tag, disc, 2) < 0 || !r->o.wait_close) { slot_finish(r, i, 1); return; }
  c->state = ST_WAIT_CLOSE; c->t0 = now_ns();
}
static void held_event(Run *r, int i) {
  char buf[4096]; int fd = r->held[i];
  if (fd < 0) return;
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL); close(fd); r->held[i] = -1; r->dropped++;
  }
}
static void check_timeouts(Run *r, uint64_t t) {
  for (int i = 0; i < r->o.conc; i++) {
    Conn *c = &r->slots[i];
    if (c->state == ST_WAIT_CLOSE && t - c->t0 > CLOSE_WAIT_NS) { r->slow_closes++; slot_finish(r, i, 1); }
    else if (c->state != ST_FREE && c->state != ST_WAIT_CLOSE && t - c->t0 > (uint64_t)(r->o.conn_timeout * 1e9)) {
      fail(r, E_TIMEOUT, c->state == ST_CONNECTING ? "TCP connect" : "CONNACK"); slot_finish(r, i, 0);
    }
  }
}
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b; return x < y ? -1 : x > y;
}
static double pct(const uint64_t *v, size_t n, double p, double scale) {
  if (!n) return 0.0;
  size_t k = (size_t)(p * (double)n + 0.999999); if (k < 1) k = 1; if (k > n) k = n;
  return (double)v[k - 1] / scale;
}
static double cpu_s(void) {
  struct rusage u; getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}
static void print_errors(Run *r) {
  long total = 0;
  for (int k = 0; k < E_KINDS; k++) total += r->err[k];
  printf("\"errors\":%ld,\"error_kinds\":{", total);
  for (int k = 0; k < E_KINDS; k++) printf("%s\"%s\":%ld", k ? "," : "", E_NAMES[k], r->err[k]);
  printf("},\"first_error\":\"%s\"", r->first_err);   /* our own messages: no quotes or backslashes */
}
static int loop_once(Run *r, int timeout_ms, void (*on)(Run *, uint64_t, uint32_t)) {
  struct epoll_event evs[256];
  int n = epoll_wait(r->ep, evs, 256, timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -1;
  for (int k = 0; k < n; k++) on(r, evs[k].data.u64, evs[k].events);
  return n;
}
static void cc_dispatch(Run *r, uint64_t tag, uint32_t ev) {
  unsigned kind = (unsigned)(tag >> 32), idx = (unsigned)tag;
  if (kind == K_SLOT) slot_event(r, (int)idx, ev);
  else if (kind == K_HELD) held_event(r, (int)idx);
  else if (kind == K_STDIN) {
    char b[256]; ssize_t n = read(0, b, sizeof b);
    if (n <= 0) { r->stdin_eof = 1; epoll_ctl(r->ep, EPOLL_CTL_DEL, 0, NULL); }
  }
}
static int run_conns(Run *r) {
  r->slots = calloc((size_t)r->o.conc, sizeof(Conn));
  r->held = calloc((size_t)r->o.n + 1, sizeof(int));
  for (int i = 0; i < r->o.conc; i++) { r->slots[i].fd = -1; slot_start(r, i); }
  uint64_t t;
  while ((t = now_ns()) < r->deadline && r->done < r->o.n && !g_stop) {
    if (loop_once(r, 20, cc_dispatch) < 0) break;
    check_timeouts(r, now_ns());
  }
  double el = (double)(now_ns() - r->start) / 1e9;
  int is_idle = !strcmp(r->o.mode, "idle");
  qsort(r->lat, r->nlat, 8, cmp_u64);
  printf("{\"mode\":\"%s\",%s\"requested\":%d,\"concurrency\":%d,\"mqtt\":%d,\"ok\":%d,", r->o.mode,
         is_idle ? "\"phase\":\"up\"," : "", r->o.n, r->o.conc, r->o.v5 ? 5 : 4, r->ok);
  print_errors(r);
  printf(",\"complete\":%s,\"elapsed_s\":%.6f,\"%s\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"p999_ms\":%.3f,"
         "\"max_ms\":%.3f,\"slow_closes\":%d,\"tool_cpu_s\":%.3f}\n", r->done >= r->o.n ? "true" : "false", el,
         is_idle ? "opens_per_s" : "connects_per_s", r->ok / (el > 0 ? el : 1e-9), pct(r->lat, r->nlat, .5, 1e6),
         pct(r->lat, r->nlat, .99, 1e6), pct(r->lat, r->nlat, .999, 1e6), pct(r->lat, r->nlat, 1.0, 1e6),
         r->slow_closes, cpu_s());
  fflush(stdout);
  if (!is_idle) return r->ok == r->o.n ? 0 : 1;
  /* Hold: stdin EOF, a signal, --hold or the deadline releases the connections. */
  struct epoll_event e = {.events = EPOLLIN, .data.u64 = (uint64_t)K_STDIN << 32};
  int watch_stdin = r->o.hold <= 0 && epoll_ctl(r->ep, EPOLL_CTL_ADD, 0, &e) == 0;
  uint64_t until = r->o.hold > 0 ? now_ns() + (uint64_t)(r->o.hold * 1e9) : r->deadline;
  if (until > r->deadline) until = r->deadline;
  while (!g_stop && (t = now_ns()) < until && (!watch_stdin || !r->stdin_eof) && (watch_stdin || r->o.hold > 0))
    if (loop_once(r, 100, cc_dispatch) < 0) break;
  for (int i = 0; i < r->nheld; i++) if (r->held[i] >= 0) close(r->held[i]);
  printf("{\"mode\":\"idle\",\"phase\":\"done\",\"held\":%d,\"dropped\":%d,\"held_s\":%.3f}\n", r->nheld,
         r->dropped, (double)(now_ns() - r->start) / 1e9 - el);
  return r->ok == r->o.n && r->dropped == 0 ? 0 : 1;
}

/* A received PUBLISH: its packet id (QoS 1) and where its payload starts; -1 (counted) when malformed. */
static int parse_publish(Run *r, unsigned char first, const unsigned char *b, size_t blen, unsigned *pid,
                         size_t *payload) {
  size_t i, qos = (first >> 1) & 3;
  if (blen < 2) { fail(r, E_PROTOCOL, "short PUBLISH"); return -1; }
  i = 2 + ((size_t)b[0] << 8 | b[1]);
  *pid = 0;
  if (qos) { if (i + 2 > blen) { fail(r, E_PROTOCOL, "short PUBLISH"); return -1; } *pid = (unsigned)b[i] << 8 | b[i + 1]; i += 2; }
  if (r->o.v5) {                                     /* skip the properties */
    size_t plen = 0; unsigned mult = 1, k = 0;
    do { if (i >= blen || k++ == 4) { fail(r, E_PROTOCOL, "bad properties"); return -1; }
         plen += (size_t)(b[i] & 0x7f) * mult; mult <<= 7; } while (b[i++] & 0x80);
    i += plen;
  }
  *payload = i;
  return 0;
}
/* SUBSCRIBE (packet id 1) to `filter` at the run's QoS; the connection then waits for SUBACK. */
static void send_subscribe(Run *r, Conn *c, uint64_t tag, const char *filter) {
  unsigned char body[300], pkt[320]; size_t i = 0, fl = strlen(filter);
  if (fl > 280) fl = 280;
  body[i++] = 0; body[i++] = 1;
  if (r->o.v5) body[i++] = 0;                        /* no properties */
  i += put_str(body + i, filter, fl); body[i++] = (unsigned char)r->o.qos;
  conn_send(r, c, tag, pkt, frame(pkt, 0x82, body, i)); c->state = ST_WAIT_SUBACK;
}
/* The start of a client connection's event: CONNECT once connected, queued bytes out. 1: nothing to read. */
static int conn_event_start(Run *r, Conn *c, uint64_t tag, uint32_t ev, const char *cid) {
  if (c->fd < 0) return 1;
  if (c->state == ST_CONNECTING) { if (tcp_connected(r, c, tag, cid) < 0) g_stop = 1; return 1; }
  if ((ev & EPOLLOUT) && c->out_len && conn_flush(r, c, tag) < 0) { fail(r, E_RESET, "send"); g_stop = 1; return 1; }
  return !(ev & (EPOLLIN | EPOLLHUP | EPOLLERR));
}

/* ---- latency ---- */
#define TAG_SUB ((uint64_t)K_SLOT << 32 | 0u)
#define TAG_PUB ((uint64_t)K_SLOT << 32 | 1u)
static void publish_one(Run *r) {
  if (r->o.qos && r->inflight >= MAX_INFLIGHT) { r->skipped++; return; }
  unsigned char body[2 + 256 + 2 + 1 + 65536]; size_t i = 0, tl = strlen(r->o.topic);
  i += put_str(body, r->o.topic, tl);
  if (r->o.qos) { unsigned pid = (unsigned)(r->sent % 65535) + 1; body[i++] = (unsigned char)(pid >> 8); body[i++] = (unsigned char)pid; }
  if (r->o.v5) body[i++] = 0;
  uint64_t seq = (uint64_t)r->sent; memset(body + i, 'x', (size_t)r->o.payload);
  unsigned char pkt[sizeof body + 8]; uint64_t ts = now_ns();
  memcpy(body + i, &ts, 8); memcpy(body + i + 8, &seq, 8); i += (size_t)r->o.payload;
  size_t n = frame(pkt, (unsigned char)(0x30 | (r->o.qos << 1)), body, i);
  if (conn_send(r, &r->pub, TAG_PUB, pkt, n) < 0) { fail(r, E_RESET, "publisher send"); g_stop = 1; return; }
  r->sent++; if (r->o.qos) r->inflight++;
}
static void on_sub_publish(Run *r, unsigned char first, unsigned char *b, size_t blen) {
  uint64_t t = now_ns(); size_t i, qos = (first >> 1) & 3; unsigned pid;
  if (parse_publish(r, first, b, blen, &pid, &i) < 0) return;
  if (qos == 1) { unsigned char ack[4] = {0x40, 2, (unsigned char)(pid >> 8), (unsigned char)pid}; conn_send(r, &r->sub, TAG_SUB, ack, 4); }
  if (i + HDR > blen) { fail(r, E_PROTOCOL, "foreign payload"); return; }
  uint64_t ts, seq; memcpy(&ts, b + i, 8); memcpy(&seq, b + i + 8, 8);
  if (seq >= (uint64_t)r->sent || ts > t) { fail(r, E_PROTOCOL, "foreign payload"); return; }
  if (r->seen[seq]) { r->dup++; return; }
  r->seen[seq] = 1; r->uniq++; add_lat(r, t - ts);
}
static void lat_conn_event(Run *r, Conn *c, uint64_t tag, uint32_t ev) {
  int is_sub = c == &r->sub;
  char cid[160] = "";
  if (c->state == ST_CONNECTING) snprintf(cid, sizeof cid, "%s-%s", r->o.prefix, is_sub ? "sub" : "pub");
  if (conn_event_start(r, c, tag, ev, cid)) return;
  int rc = conn_read(c); size_t off = 0;
  unsigned char first, *b; size_t blen, total; int p;
  while ((p = next_packet(c, off, &first, &b, &blen, &total)) == 1) {
    off += total;
    unsigned type = first >> 4;
    if (c->state == ST_WAIT_CONNACK) {
      if (check_connack(r, first, b, blen) < 0) { g_stop = 1; return; }
      if (is_sub) {
        send_subscribe(r, c, tag, r->o.topic);
      } else { c->state = ST_READY; r->start = now_ns(); r->pub_end = r->start + (uint64_t)(r->o.seconds * 1e9);
        struct itimerspec its = {0}; long iv = (long)(1e9 / r->o.rate); if (iv < 1000) iv = 1000;
        its.it_interval.tv_nsec = iv % 1000000000L; its.it_interval.tv_sec = iv / 1000000000L; its.it_value = its.it_interval;
        timerfd_settime(r->tfd, 0, &its, NULL); }
    } else if (c->state == ST_WAIT_SUBACK && type == 9) {
      size_t rcoff = r->o.v5 ? 2 + 1 + (blen > 2 ? b[2] : 0) : 2;   /* v5: skip a short property length */
      if (rcoff >= blen || b[rcoff] >= 0x80) { fail(r, E_REFUSED, "SUBACK failure"); g_stop = 1; return; }
      c->state = ST_READY;
      if (tcp_open(r, &r->pub, TAG_PUB) < 0) { g_stop = 1; return; }
    } else if (is_sub && type == 3) on_sub_publish(r, first, b, blen);
    else if (!is_sub && type == 4) { r->acked++; if (r->inflight) r->inflight--; }
    else if (type != 13) { fail(r, E_PROTOCOL, "unexpected packet"); }
  }
  memmove(c->in, c->in + off, c->in_len - off); c->in_len -= off;
  if (p < 0 || rc != 0) { fail(r, p < 0 || rc < 0 ? E_PROTOCOL : E_RESET, is_sub ? "subscriber lost" : "publisher lost"); g_stop = 1; }
}
static void lat_dispatch(Run *r, uint64_t tag, uint32_t ev) {
  if (tag == TAG_SUB) lat_conn_event(r, &r->sub, tag, ev);
  else if (tag == TAG_PUB) lat_conn_event(r, &r->pub, tag, ev);
  else if (tag >> 32 == K_TIMER) {
    uint64_t k = 0; if (read(r->tfd, &k, 8) != 8) return;
    for (uint64_t j = 0; j < k && !r->pub_done; j++) {
      if (now_ns() >= r->pub_end || r->sent >= r->cap) { r->pub_done = 1; r->pub_stop = now_ns(); struct itimerspec z = {0}; timerfd_settime(r->tfd, 0, &z, NULL); break; }
      publish_one(r);
    }
  }
}
static int run_latency(Run *r) {
  r->cap = (long)(r->o.rate * r->o.seconds * 1.01) + 16;   /* timer catch-up can exceed rate * seconds */
  r->seen = calloc((size_t)r->cap, 1); r->sub.fd = r->pub.fd = -1;
  r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  struct epoll_event e = {.events = EPOLLIN, .data.u64 = (uint64_t)K_TIMER << 32};
  epoll_ctl(r->ep, EPOLL_CTL_ADD, r->tfd, &e);
  if (tcp_open(r, &r->sub, TAG_SUB) < 0) g_stop = 1;
  uint64_t t = 0, drain_until = 0;
  while (!g_stop && (t = now_ns()) < r->deadline) {
    if (r->pub_done) {
      if (!drain_until) drain_until = t + (uint64_t)(r->o.drain * 1e9);
      if (t >= drain_until || (r->uniq >= r->sent && (!r->o.qos || r->acked >= r->sent))) break;
    }
    if (loop_once(r, 10, lat_dispatch) < 0) break;
    if (r->sub.state < ST_READY && r->sub.fd >= 0 && t - r->sub.t0 > (uint64_t)(r->o.conn_timeout * 1e9)) {
      fail(r, E_TIMEOUT, "subscriber setup"); break; }
  }
  static const unsigned char disc[2] = {0xe0, 0x00};
  if (r->pub.fd >= 0) { conn_send(r, &r->pub, TAG_PUB, disc, 2); conn_close(r, &r->pub); }
  if (r->sub.fd >= 0) { conn_send(r, &r->sub, TAG_SUB, disc, 2); conn_close(r, &r->sub); }
  if (!r->pub_stop) r->pub_stop = now_ns();          /* stopped early: by the deadline, a signal or an error */
  qsort(r->lat, r->nlat, 8, cmp_u64);
  double el = r->pub_stop > r->start ? (double)(r->pub_stop - r->start) / 1e9 : 0, sum = 0;
  for (size_t k = 0; k < r->nlat; k++) sum += (double)r->lat[k];
  printf("{\"mode\":\"latency\",\"mqtt\":%d,\"qos\":%d,\"rate\":%.1f,\"seconds\":%.3f,\"payload\":%d,\"sent\":%ld,"
         "\"acked\":%ld,\"received\":%ld,\"dup\":%ld,\"lost\":%ld,\"skipped\":%ld,", r->o.v5 ? 5 : 4, r->o.qos,
         r->o.rate, el, r->o.payload, r->sent, r->acked, r->uniq, r->dup, r->sent - r->uniq, r->skipped);
  print_errors(r);
  printf(",\"complete\":%s,\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f,"
         "\"tool_cpu_s\":%.3f}\n", r->pub_done ? "true" : "false", pct(r->lat, r->nlat, .5, 1e3),
         pct(r->lat, r->nlat, .99, 1e3), pct(r->lat, r->nlat, .999, 1e3), pct(r->lat, r->nlat, 1.0, 1e3),
         r->nlat ? sum / (double)r->nlat / 1e3 : 0.0, cpu_s());
  fflush(stdout);
  long errs = 0; for (int k = 0; k < E_KINDS; k++) errs += r->err[k];
  return r->pub_done && r->sent > 0 && r->uniq == r->sent && !errs ? 0 : 1;
}

/* ---- fanin ---- */
#define TAG_FANIN(i) ((uint64_t)K_SLOT << 32 | (uint64_t)(i))       /* 0: the subscriber, 1..n: publishers */
static void fanin_publish(Run *r, int k) {
  Conn *c = &r->pubs[k];
  unsigned char body[2 + 300 + 2 + 1 + 65536], pkt[sizeof body + 8]; size_t i = 0;
  char topic[300]; int tl = snprintf(topic, sizeof topic, "%s/%d", r->o.topic, k);
  i += put_str(body, topic, (size_t)tl);
  long seq = r->pub_sent[k];
  if (r->o.qos) { unsigned pid = (unsigned)(seq % 65535) + 1; body[i++] = (unsigned char)(pid >> 8); body[i++] = (unsigned char)pid; }
  if (r->o.v5) body[i++] = 0;
  memset(body + i, 'x', (size_t)r->o.payload);
  uint64_t ts = now_ns(), s64 = (uint64_t)seq; uint32_t who = (uint32_t)k;
  memcpy(body + i, &ts, 8); memcpy(body + i + 8, &s64, 8); memcpy(body + i + 16, &who, 4); i += (size_t)r->o.payload;
  conn_queue(c, pkt, frame(pkt, (unsigned char)(0x30 | (r->o.qos << 1)), body, i));
  r->pub_sent[k]++; r->sent++;
  if (r->o.qos) r->pub_inflight[k]++;
}
static void fanin_fill(Run *r, int k) {        /* the publisher's window: QoS 1 up to W unacked, QoS 0 W at once */
  if (r->pub_done || r->ready < r->o.n || r->pubs[k].state != ST_READY) return;   /* the clock has not started */
  if (now_ns() >= r->pub_end) { r->pub_done = 1; r->pub_stop = now_ns(); r->in_window = r->uniq; return; }
  if (r->o.qos) { while (r->pub_inflight[k] < r->window) fanin_publish(r, k); }
  else if (r->pubs[k].out_len == 0) { for (int j = 0; j < r->window; j++) fanin_publish(r, k); }
  if (conn_push(r, &r->pubs[k], TAG_FANIN(k + 1)) < 0) { fail(r, E_RESET, "publisher send"); g_stop = 1; }
}
static void fanin_received(Run *r, unsigned char first, unsigned char *b, size_t blen) {
  uint64_t t = now_ns(); size_t i, qos = (first >> 1) & 3; unsigned pid;
  if (parse_publish(r, first, b, blen, &pid, &i) < 0) return;
  if (qos) { unsigned char ack[4] = {qos == 1 ? 0x40 : 0x50, 2, (unsigned char)(pid >> 8), (unsigned char)pid}; conn_queue(&r->sub, ack, 4); }
  if (i + 20 > blen) { fail(r, E_PROTOCOL, "foreign payload"); return; }
  uint64_t ts, seq; uint32_t who; memcpy(&ts, b + i, 8); memcpy(&seq, b + i + 8, 8); memcpy(&who, b + i + 16, 4);
  if (who >= (uint32_t)r->o.n || (long)seq >= r->pub_sent[who] || ts > t) { fail(r, E_PROTOCOL, "foreign payload"); return; }
  /* One publisher's messages arrive in order: behind the next expected is a duplicate, past it a gap. */
  if ((long)seq < r->expect[who]) { r->dup++; return; }
  r->gaps += (long)seq - r->expect[who]; r->expect[who] = (long)seq + 1; r->uniq++;
  if (!r->pub_done) add_lat(r, t - ts);
}
static void fanin_conn_event(Run *r, int idx, uint32_t ev) {
  Conn *c = idx == 0 ? &r->sub : &r->pubs[idx - 1]; uint64_t tag = TAG_FANIN(idx);
  char cid[160] = "";
  if (c->state == ST_CONNECTING) snprintf(cid, sizeof cid, idx == 0 ? "%s-sub" : "%s-pub%d", r->o.prefix, idx - 1);
  if (conn_event_start(r, c, tag, ev, cid)) { if (idx && c->fd >= 0) fanin_fill(r, idx - 1); return; }
  int rc = conn_read(c); size_t off = 0;
  unsigned char first, *b; size_t blen, total; int p;
  while ((p = next_packet(c, off, &first, &b, &blen, &total)) == 1) {
    off += total;
    unsigned type = first >> 4;
    if (c->state == ST_WAIT_CONNACK) {
      if (check_connack(r, first, b, blen) < 0) { g_stop = 1; return; }
      if (idx == 0) {
        char filter[280]; snprintf(filter, sizeof filter, "%s/+", r->o.topic);
        send_subscribe(r, c, tag, filter);
      } else {
        c->state = ST_READY;
        if (++r->ready == r->o.n) {                  /* every publisher is in: the clock starts */
          r->start = now_ns(); r->pub_end = r->start + (uint64_t)(r->o.seconds * 1e9);
          for (int k = 0; k < r->o.n; k++) fanin_fill(r, k);
        }
      }
    } else if (c->state == ST_WAIT_SUBACK && type == 9) {
      size_t rcoff = r->o.v5 ? 2 + 1 + (blen > 2 ? b[2] : 0) : 2;
      if (rcoff >= blen || b[rcoff] >= 0x80) { fail(r, E_REFUSED, "SUBACK failure"); g_stop = 1; return; }
      c->state = ST_READY;
      for (int k = 0; k < r->o.n; k++) if (tcp_open(r, &r->pubs[k], TAG_FANIN(k + 1)) < 0) { g_stop = 1; return; }
    } else if (idx == 0 && type == 3) fanin_received(r, first, b, blen);
    else if (idx == 0 && type == 6 && blen >= 2) { unsigned char comp[4] = {0x70, 2, b[0], b[1]}; conn_queue(&r->sub, comp, 4); }
    else if (idx > 0 && type == 5 && blen >= 2) { unsigned char rel[4] = {0x62, 2, b[0], b[1]}; conn_queue(c, rel, 4); }
    else if (idx > 0 && (type == 4 || type == 7)) { r->acked++; if (r->pub_inflight[idx - 1]) r->pub_inflight[idx - 1]--; }
    else if (type != 13) { fail(r, E_PROTOCOL, "unexpected packet"); }
  }
  memmove(c->in, c->in + off, c->in_len - off); c->in_len -= off;
  if (p < 0 || rc != 0) { fail(r, p < 0 || rc < 0 ? E_PROTOCOL : E_RESET, idx ? "publisher lost" : "subscriber lost"); g_stop = 1; return; }
  if (idx) {
    fanin_fill(r, idx - 1);
    if (c->out_len && conn_push(r, c, tag) < 0) { fail(r, E_RESET, "publisher send"); g_stop = 1; return; }   /* PUBRELs */
  } else {
    if (conn_push(r, c, tag) < 0) { fail(r, E_RESET, "subscriber send"); g_stop = 1; return; }   /* the PUBACKs */
    if (!r->o.qos) for (int k = 0; k < r->o.n; k++) fanin_fill(r, k);
  }
}
static void fanin_dispatch(Run *r, uint64_t tag, uint32_t ev) {
  uint32_t idx = (uint32_t)tag;
  if (tag >> 32 == K_SLOT && idx <= (uint32_t)r->o.n) fanin_conn_event(r, (int)idx, ev);
}
static int run_fanin(Run *r) {
  int n = r->o.n;
  r->pubs = calloc((size_t)n, sizeof(Conn)); r->pub_sent = calloc((size_t)n, sizeof(long));
  r->pub_inflight = calloc((size_t)n, sizeof(long)); r->expect = calloc((size_t)n, sizeof(long));
  r->window = r->o.window; r->sub.fd = -1;
  for (int k = 0; k < n; k++) r->pubs[k].fd = -1;
  if (tcp_open(r, &r->sub, TAG_FANIN(0)) < 0) g_stop = 1;
  uint64_t t = 0, drain_until = 0;
  while (!g_stop && (t = now_ns()) < r->deadline) {
    if (r->ready == n && !r->pub_done && t >= r->pub_end) { r->pub_done = 1; r->pub_stop = t; r->in_window = r->uniq; }
    if (r->pub_done) {
      if (!drain_until) drain_until = t + (uint64_t)(r->o.drain * 1e9);
      if (t >= drain_until || (r->uniq >= r->sent && (!r->o.qos || r->acked >= r->sent))) break;
    }
    if (loop_once(r, 10, fanin_dispatch) < 0) break;
    if (r->ready < n && t - r->start > (uint64_t)(r->o.conn_timeout * 1e9)) { fail(r, E_TIMEOUT, "setup"); break; }
  }
  static const unsigned char disc[2] = {0xe0, 0x00};
  for (int k = 0; k < n; k++) if (r->pubs[k].fd >= 0) { conn_send(r, &r->pubs[k], TAG_FANIN(k + 1), disc, 2); conn_close(r, &r->pubs[k]); }
  if (r->sub.fd >= 0) { conn_send(r, &r->sub, TAG_FANIN(0), disc, 2); conn_close(r, &r->sub); }
  if (!r->pub_stop) { r->pub_stop = now_ns(); r->in_window = r->uniq; }
  qsort(r->lat, r->nlat, 8, cmp_u64);
  double el = r->pub_stop > r->start && r->ready == n ? (double)(r->pub_stop - r->start) / 1e9 : 0;
  printf("{\"mode\":\"fanin\",\"mqtt\":%d,\"qos\":%d,\"publishers\":%d,\"window\":%d,\"seconds\":%.3f,\"payload\":%d,"
         "\"sent\":%ld,\"acked\":%ld,\"received\":%ld,\"dup\":%ld,\"lost\":%ld,\"gaps\":%ld,", r->o.v5 ? 5 : 4, r->o.qos, n,
         r->window, el, r->o.payload, r->sent, r->acked, r->uniq, r->dup, r->sent - r->uniq, r->gaps);
  print_errors(r);
  printf(",\"complete\":%s,\"msgs_per_s\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"p999_ms\":%.3f,\"tool_cpu_s\":%.3f}\n",
         r->pub_done ? "true" : "false", el > 0 ? (double)r->in_window / el : 0.0, pct(r->lat, r->nlat, .5, 1e6),
         pct(r->lat, r->nlat, .99, 1e6), pct(r->lat, r->nlat, .999, 1e6), cpu_s());
  fflush(stdout);
  long errs = 0; for (int k = 0; k < E_KINDS; k++) errs += r->err[k];
  return r->pub_done && r->sent > 0 && r->uniq == r->sent && !errs ? 0 : 1;
}

static void usage(void) {
  fprintf(stderr, "usage: mqttload connect|idle|latency|fanin [--host H] [--port P] [--sub-port P] [-n N] [-c C]\n"
          "  [--mqtt5] [--keepalive S] [--prefix ID] [--timeout S] [--conn-timeout S] [--no-wait-close] [--hold S]\n"
          "  [--rate R] [--seconds S] [--qos 0|1|2] [--payload BYTES] [--topic T] [--drain S] [--window W] [--persistent]\n");
  exit(2);
}
int main(int argc, char **argv) {
  static Run run; Run *r = &run; Opts *o = &r->o;
  char topic[200], prefix[100];
  snprintf(prefix, sizeof prefix, "mqttload-%d", (int)getpid());
  *o = (Opts){.host = "127.0.0.1", .port = 1883, .n = 1000, .conc = 100, .keepalive = 60, .qos = 1, .payload = 64,
              .wait_close = 1, .rate = 1000, .seconds = 5, .timeout = 120, .conn_timeout = 10, .drain = 2, .window = 100,
              .prefix = prefix, .topic = NULL};
  if (argc < 2) usage();
  o->mode = argv[1];
  if (strcmp(o->mode, "connect") && strcmp(o->mode, "idle") && strcmp(o->mode, "latency") && strcmp(o->mode, "fanin"))
    usage();
  if (!strcmp(o->mode, "idle")) o->keepalive = 600;
  if (!strcmp(o->mode, "fanin")) o->n = 10;   /* publishers */
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (!strcmp(a, name) && v && ++i)
    if (ARG("--host")) o->host = v; else if (ARG("--port")) o->port = atoi(v);
    else if (ARG("--sub-port")) o->sub_port = atoi(v);
    else if (ARG("-n")) o->n = atoi(v); else if (ARG("-c")) o->conc = atoi(v);
    else if (ARG("--keepalive")) o->keepalive = atoi(v); else if (ARG("--prefix")) o->prefix = v;
    else if (ARG("--timeout")) o->timeout = atof(v); else if (ARG("--conn-timeout")) o->conn_timeout = atof(v);
    else if (ARG("--hold")) o->hold = atof(v); else if (ARG("--rate")) o->rate = atof(v);
    else if (ARG("--seconds")) o->seconds = atof(v); else if (ARG("--qos")) o->qos = atoi(v);
    else if (ARG("--payload")) o->payload = atoi(v); else if (ARG("--topic")) o->topic = v;
    else if (ARG("--drain")) o->drain = atof(v); else if (ARG("--window")) o->window = atoi(v);
    else if (!strcmp(a, "--mqtt5")) o->v5 = 1; else if (!strcmp(a, "--no-wait-close")) o->wait_close = 0;
    else if (!strcmp(a, "--persistent")) o->persistent = 1;
    else usage();
  }
  if (o->n < 0 || o->conc < 1 || o->qos < 0 || o->qos > (strcmp(o->mode, "fanin") ? 1 : 2) || o->payload < HDR || o->payload > 65536 ||
      o->rate <= 0 || o->seconds <= 0 || o->keepalive < 0 || o->keepalive > 65535 || strlen(o->prefix) > 90 ||
      o->timeout <= 0 || o->window < 1 || o->window > 60000) usage();
  if (o->conc > o->n && o->n > 0) o->conc = o->n;
  if (!o->topic) { snprintf(topic, sizeof topic, "mqttload/%s/%s", o->prefix, o->mode); o->topic = topic; }
  if (strlen(o->topic) > 250) usage();
  r->addr.sin_family = AF_INET; r->addr.sin_port = htons((uint16_t)o->port);
  if (inet_pton(AF_INET, o->host, &r->addr.sin_addr) != 1) { fprintf(stderr, "mqttload: bad IPv4 host\n"); return 2; }
  r->sub_addr = r->addr; r->sub_addr.sin_port = htons((uint16_t)(o->sub_port ? o->sub_port : o->port));
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_handler = on_signal;   /* no SA_RESTART: wake epoll */
  sigaction(SIGINT, &sa, NULL); sigaction(SIGTERM, &sa, NULL); signal(SIGPIPE, SIG_IGN);
  r->ep = epoll_create1(EPOLL_CLOEXEC);
  r->start = now_ns(); r->deadline = r->start + (uint64_t)(o->timeout * 1e9);
  if (!strcmp(o->mode, "fanin")) return o->n < 1 || o->payload < HDR + 4 ? (usage(), 2) : run_fanin(r);
  return !strcmp(o->mode, "latency") ? run_latency(r) : run_conns(r);
}
