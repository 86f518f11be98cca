// SPDX-License-Identifier: GPL-2.0
/*
 * SparSEEty syscall-level capture: the bytes a process writes to and reads
 * from its TCP sockets, as seen at the syscall boundary (plain text even when
 * the wire is not, no reassembly needed).
 *
 * Attached only to tracepoints (syscalls/sys_enter_* + sys_exit_*,
 * sock/inet_sock_set_state): no kprobes, no fentry.
 *
 * Flow per syscall:
 *   sys_enter_X  process filter (tgid / comm), fd -> struct file -> socket ->
 *                sk, TCP only, port filter; remember (sk, buffer) per thread.
 *   sys_exit_X   copy `ret` bytes (walking iovecs) into ring records of at
 *                most CHUNK bytes, each with its per-(sk, direction) offset.
 *   inet_sock_set_state
 *                remembers who opened the connection (role), reports our FIN
 *                (SHUTDOWN) and the end of the socket (CLOSE).
 *
 * Record layout is `struct rec_hdr` followed by `len` data bytes; loader.py
 * mirrors it (HDR_FMT). Keep the two in sync.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "GPL";

#define CHUNK 16384
#define MAX_IOV 64
#define AF_INET 2
#define AF_INET6 10
#define MSG_PEEK 2
#define S_IFMT 0170000
#define S_IFSOCK 0140000

/* record kinds */
#define K_DATA 1
#define K_EOF 2      /* a read returned 0: the peer's bytes ended (dir = RECV) */
#define K_SHUTDOWN 3 /* this socket sent its FIN (dir = SENT) */
#define K_CLOSE 4    /* socket reached TCP_CLOSE; offset = sent, aux = received */
/* K_DATA aux: SEQ_KNOWN | TCP sequence number of the direction's offset 0 */
#define SEQ_KNOWN (1ULL << 32)

/* directions, from the traced process's point of view */
#define D_SENT 0
#define D_RECV 1

/* roles, from inet_sock_set_state */
#define R_UNKNOWN 0
#define R_CLIENT 1 /* active open (SYN_SENT -> ESTABLISHED) */
#define R_SERVER 2 /* passive open (SYN_RECV -> ESTABLISHED) */

/* cfg.flags */
#define F_PIDS 1
#define F_COMMS 2
#define F_PORTS 4
#define F_DEDUPE 8 /* drop client sockets whose peer is loopback (server side is traced too) */

/* counters[] slots */
#define C_LOST_RECORDS 0
#define C_LOST_BYTES 1
#define C_READ_ERRORS 2
#define C_SERIAL 3
#define C_IOV_TRUNC 4
#define C_NSLOTS 8

struct rec_hdr {
	__u64 ts;
	__u64 sk;
	__u64 offset;
	__u64 aux;
	__u32 serial;
	__u32 len;
	__u32 tgid;
	__u32 pid;
	__s32 fd;
	__u16 lport;
	__u16 rport;
	__u8 kind;
	__u8 dir;
	__u8 role;
	__u8 family;
	__u8 state;
	__u8 pad[3];
	__u8 laddr[16];
	__u8 raddr[16];
	char comm[16];
};

_Static_assert(sizeof(struct rec_hdr) == 112, "loader.py HDR expects 112 bytes");
_Static_assert(__builtin_offsetof(struct rec_hdr, serial) == 32, "loader.py HDR");
_Static_assert(__builtin_offsetof(struct rec_hdr, fd) == 48, "loader.py HDR");
_Static_assert(__builtin_offsetof(struct rec_hdr, kind) == 56, "loader.py HDR");
_Static_assert(__builtin_offsetof(struct rec_hdr, laddr) == 64, "loader.py HDR");
_Static_assert(__builtin_offsetof(struct rec_hdr, comm) == 96, "loader.py HDR");

struct rec {
	struct rec_hdr h;
	__u8 data[CHUNK];
};

struct cfg {
	__u32 flags;
	__u32 self_tgid;
};

struct comm_key {
	char c[16];
};

struct pending {
	__u64 sk;
	__u64 buf;    /* data pointer, or iovec array pointer when vec */
	__u64 iovcnt;
	__s32 fd;
	__u8 dir;
	__u8 vec;
};

struct conn {
	__u64 off[2];  /* bytes per direction since tracking began */
	__u64 lost[2]; /* bytes per direction that never reached the ring */
	__u32 serial;
	__u8 role;
};

_Static_assert(sizeof(struct conn) == 40, "loader.py CONN expects 40 bytes");

/*
 * bpf_loop contexts. The verifier explores callback iterations until their
 * states converge, so no field may hold a constant that changes per iteration
 * (an iovec index compared with a constant explodes the state space): the
 * iovec index is bpf_loop's own iteration argument, which it treats as unknown.
 */
struct chunk_ctx {
	__u64 sk;
	__u64 ptr;
	__u64 left; /* bytes of this buffer still to emit */
	__u64 off;  /* stream offset of ptr */
	__u32 dir;
};

struct iov_ctx {
	__u64 sk;
	__u64 iov;
	__u64 remaining; /* bytes of the return value not yet placed */
	__u64 off;
	__u32 dir;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} rb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cfg);
} cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct comm_key);
	__type(value, __u8);
} comms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16);
	__type(value, __u8);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pending);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct conn);
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u8);
} roles SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, C_NSLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rec);
} scratch SEC(".maps");

static __always_inline void count(__u32 slot, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &slot);

	if (v)
		__sync_fetch_and_add(v, n);
}

static __always_inline bool proc_selected(void)
{
	__u32 zero = 0;
	struct cfg *c = bpf_map_lookup_elem(&cfg, &zero);
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	if (!c || tgid == c->self_tgid)
		return false;
	if (!(c->flags & (F_PIDS | F_COMMS)))
		return true;
	if ((c->flags & F_PIDS) && bpf_map_lookup_elem(&pids, &tgid))
		return true;
	if (c->flags & F_COMMS) {
		struct comm_key k = {};

		bpf_get_current_comm(k.c, sizeof(k.c));
		if (bpf_map_lookup_elem(&comms, &k))
			return true;
	}
	return false;
}

static __always_inline bool peer_is_loopback(struct sock *sk, __u16 family)
{
	if (family == AF_INET) {
		__u8 a[4];

		bpf_core_read(a, 4, &sk->__sk_common.skc_daddr);
		return a[0] == 127;
	}
	__u32 w[4];

	bpf_core_read(w, 16, &sk->__sk_common.skc_v6_daddr);
	if (w[0] || w[1])
		return false;
	if (w[2] == 0 && w[3] == bpf_htonl(1))
		return true;
	if (w[2] == bpf_htonl(0xffff))
		return (bpf_ntohl(w[3]) >> 24) == 127;
	return false;
}

/* fd of the current task -> its TCP sock, if it is one and passes the port filter. */
static __always_inline struct sock *selected_sock(int fd)
{
	__u32 zero = 0;
	struct cfg *c = bpf_map_lookup_elem(&cfg, &zero);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt;
	struct file **fda;
	struct file *f = NULL;
	struct socket *so;
	struct sock *sk;
	unsigned int max;
	umode_t mode;
	__u16 family, proto, type, lport, rport;

	if (!c || fd < 0)
		return NULL;
	fdt = BPF_CORE_READ(task, files, fdt);
	max = BPF_CORE_READ(fdt, max_fds);
	if ((unsigned int)fd >= max)
		return NULL;
	fda = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fda[fd]) || !f)
		return NULL;
	mode = BPF_CORE_READ(f, f_inode, i_mode);
	if ((mode & S_IFMT) != S_IFSOCK)
		return NULL;
	so = (struct socket *)BPF_CORE_READ(f, private_data);
	sk = BPF_CORE_READ(so, sk);
	if (!sk)
		return NULL;
	proto = BPF_CORE_READ(sk, sk_protocol);
	type = BPF_CORE_READ(sk, sk_type);
	family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if (proto != IPPROTO_TCP || type != SOCK_STREAM)
		return NULL;
	if (family != AF_INET && family != AF_INET6)
		return NULL;
	if (c->flags & F_PORTS) {
		lport = BPF_CORE_READ(sk, __sk_common.skc_num);
		rport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
		if (!bpf_map_lookup_elem(&ports, &lport)) {
			if (!bpf_map_lookup_elem(&ports, &rport))
				return NULL;
			if ((c->flags & F_DEDUPE) && peer_is_loopback(sk, family))
				return NULL;
		}
	}
	return sk;
}

static __always_inline void fill_sock(struct rec_hdr *h, struct sock *sk)
{
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);

	h->family = family;
	h->lport = BPF_CORE_READ(sk, __sk_common.skc_num);
	h->rport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (family == AF_INET) {
		bpf_core_read(h->laddr, 4, &sk->__sk_common.skc_rcv_saddr);
		bpf_core_read(h->raddr, 4, &sk->__sk_common.skc_daddr);
	} else {
		bpf_core_read(h->laddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
		bpf_core_read(h->raddr, 16, &sk->__sk_common.skc_v6_daddr);
	}
}

static __always_inline void fill_task(struct rec_hdr *h, int fd)
{
	__u64 id = bpf_get_current_pid_tgid();

	h->tgid = id >> 32;
	h->pid = (__u32)id;
	h->fd = fd;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

/* The socket's sequence number just past the bytes the application has
 * written (write_seq) or read (copied_seq): after the syscall, its own bytes
 * included. */
static __always_inline __u32 tcp_seq_after(struct sock *sk, __u8 dir)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;

	if (dir == D_SENT)
		return BPF_CORE_READ(tp, write_seq);
	return BPF_CORE_READ(tp, copied_seq);
}

static __always_inline struct conn *get_conn(__u64 sk)
{
	struct conn *c = bpf_map_lookup_elem(&conns, &sk);
	struct conn n = {};
	__u32 slot = C_SERIAL;
	__u64 *serial;
	__u8 *role;

	if (c)
		return c;
	serial = bpf_map_lookup_elem(&counters, &slot);
	if (serial)
		n.serial = (__u32)__sync_fetch_and_add(serial, 1) + 1;
	role = bpf_map_lookup_elem(&roles, &sk);
	if (role)
		n.role = *role;
	bpf_map_update_elem(&conns, &sk, &n, BPF_NOEXIST);
	return bpf_map_lookup_elem(&conns, &sk);
}

static __always_inline void note_lost(__u64 sk, __u32 dir, __u64 n)
{
	struct conn *c = bpf_map_lookup_elem(&conns, &sk);

	if (c)
		__sync_fetch_and_add(&c->lost[dir & 1], n);
}

static long chunk_cb(__u64 i, void *arg)
{
	struct chunk_ctx *x = arg;
	__u32 zero = 0;
	struct rec *r;
	__u64 n;

	if (x->left == 0)
		return 1;
	r = bpf_map_lookup_elem(&scratch, &zero);
	if (!r)
		return 1;
	n = x->left;
	if (n > CHUNK)
		n = CHUNK;
	r->h.offset = x->off;
	r->h.len = n;
	if (bpf_probe_read_user(r->data, n, (void *)x->ptr)) {
		count(C_READ_ERRORS, 1);
		note_lost(x->sk, x->dir, n);
	} else if (bpf_ringbuf_output(&rb, r, sizeof(struct rec_hdr) + n, 0)) {
		count(C_LOST_RECORDS, 1);
		count(C_LOST_BYTES, n);
		note_lost(x->sk, x->dir, n);
	}
	x->ptr += n;
	x->left -= n;
	x->off += n;
	return 0;
}

static __always_inline void emit_buffer(__u64 sk, __u32 dir, __u64 ptr, __u64 len, __u64 off)
{
	struct chunk_ctx c = {.sk = sk, .ptr = ptr, .left = len, .off = off, .dir = dir};
	__u64 nloops = len / CHUNK + 1;

	if (nloops > (1 << 23))
		nloops = 1 << 23;
	bpf_loop(nloops, chunk_cb, &c, 0);
}

static long iov_cb(__u64 i, void *arg)
{
	struct iov_ctx *x = arg;
	struct iovec iv;
	__u64 len;

	if (x->remaining == 0)
		return 1;
	if (bpf_probe_read_user(&iv, sizeof(iv), (void *)(x->iov + i * sizeof(struct iovec))))
		return 1;
	len = iv.iov_len < x->remaining ? iv.iov_len : x->remaining;
	if (len)
		emit_buffer(x->sk, x->dir, (__u64)iv.iov_base, len, x->off);
	x->remaining -= len;
	x->off += len;
	return 0;
}

static __always_inline int on_enter(int fd, __u64 buf, __u64 iovcnt, __u8 dir, __u8 vec)
{
	struct pending p = {};
	__u64 id;
	struct sock *sk;

	if (!proc_selected())
		return 0;
	sk = selected_sock(fd);
	if (!sk)
		return 0;
	id = bpf_get_current_pid_tgid();
	p.sk = (__u64)sk;
	p.buf = buf;
	p.iovcnt = iovcnt;
	p.fd = fd;
	p.dir = dir;
	p.vec = vec;
	bpf_map_update_elem(&pending, &id, &p, BPF_ANY);
	return 0;
}

static __always_inline void emit_small(struct rec_hdr *h)
{
	if (bpf_ringbuf_output(&rb, h, sizeof(*h), 0))
		count(C_LOST_RECORDS, 1);
}

static __always_inline int on_exit(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct pending *pp = bpf_map_lookup_elem(&pending, &id);
	struct pending p;
	struct sock *sk;
	struct conn *c;
	struct rec *r;
	struct iov_ctx x = {};
	__u32 zero = 0;
	__u64 base, nloops;

	if (!pp)
		return 0;
	p = *pp;
	bpf_map_delete_elem(&pending, &id);
	if (ret < 0 || (ret == 0 && p.dir != D_RECV))
		return 0;
	sk = (struct sock *)p.sk;
	c = get_conn(p.sk);
	if (!c)
		return 0;
	r = bpf_map_lookup_elem(&scratch, &zero);
	if (!r)
		return 0;
	r->h.ts = bpf_ktime_get_ns();
	r->h.sk = p.sk;
	r->h.aux = 0;
	r->h.serial = c->serial;
	r->h.role = c->role;
	r->h.dir = p.dir;
	r->h.state = 0;
	fill_task(&r->h, p.fd);
	fill_sock(&r->h, sk);
	if (ret == 0) {
		r->h.kind = K_EOF;
		r->h.offset = c->off[D_RECV];
		r->h.len = 0;
		emit_small(&r->h);
		return 0;
	}
	r->h.kind = K_DATA;
	base = __sync_fetch_and_add(&c->off[p.dir & 1], (__u64)ret);
	/* The TCP sequence number of this direction's offset 0 (bit 32: known):
	 * the socket's own byte count, which outlives this program. A restarted
	 * sidecar compares it with the checkpoint's to size the bytes it missed. */
	r->h.aux = SEQ_KNOWN | (__u32)(tcp_seq_after(sk, p.dir) - (__u32)ret - (__u32)base);
	if (!p.vec) {
		emit_buffer(p.sk, p.dir, p.buf, ret, base);
		return 0;
	}
	x.sk = p.sk;
	x.iov = p.buf;
	x.remaining = ret;
	x.off = base;
	x.dir = p.dir;
	nloops = p.iovcnt < MAX_IOV ? p.iovcnt : MAX_IOV;
	bpf_loop(nloops, iov_cb, &x, 0);
	if (x.remaining) {
		/* more iovecs than we walk: the offsets will show the hole */
		count(C_IOV_TRUNC, x.remaining);
		note_lost(p.sk, p.dir, x.remaining);
	}
	return 0;
}

static __always_inline int on_enter_msg(int fd, __u64 umsg, __u64 flags, __u8 dir)
{
	struct user_msghdr m;

	if (dir == D_RECV && (flags & MSG_PEEK))
		return 0;
	if (!proc_selected())
		return 0;
	if (bpf_probe_read_user(&m, sizeof(m), (void *)umsg))
		return 0;
	return on_enter(fd, (__u64)m.msg_iov, m.msg_iovlen, dir, 1);
}

#define ARG(i) (ctx->args[i])

SEC("tracepoint/syscalls/sys_enter_write")
int spy_write_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter(ARG(0), ARG(1), 0, D_SENT, 0);
}

SEC("tracepoint/syscalls/sys_enter_sendto")
int spy_sendto_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter(ARG(0), ARG(1), 0, D_SENT, 0);
}

SEC("tracepoint/syscalls/sys_enter_writev")
int spy_writev_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter(ARG(0), ARG(1), ARG(2), D_SENT, 1);
}

SEC("tracepoint/syscalls/sys_enter_sendmsg")
int spy_sendmsg_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter_msg(ARG(0), ARG(1), ARG(2), D_SENT);
}

SEC("tracepoint/syscalls/sys_enter_read")
int spy_read_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter(ARG(0), ARG(1), 0, D_RECV, 0);
}

SEC("tracepoint/syscalls/sys_enter_recvfrom")
int spy_recvfrom_in(struct trace_event_raw_sys_enter *ctx)
{
	if (ARG(3) & MSG_PEEK)
		return 0;
	return on_enter(ARG(0), ARG(1), 0, D_RECV, 0);
}

SEC("tracepoint/syscalls/sys_enter_readv")
int spy_readv_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter(ARG(0), ARG(1), ARG(2), D_RECV, 1);
}

SEC("tracepoint/syscalls/sys_enter_recvmsg")
int spy_recvmsg_in(struct trace_event_raw_sys_enter *ctx)
{
	return on_enter_msg(ARG(0), ARG(1), ARG(2), D_RECV);
}

SEC("tracepoint/syscalls/sys_exit_write")
int spy_write_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_sendto")
int spy_sendto_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_writev")
int spy_writev_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_sendmsg")
int spy_sendmsg_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_read")
int spy_read_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_recvfrom")
int spy_recvfrom_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_readv")
int spy_readv_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/syscalls/sys_exit_recvmsg")
int spy_recvmsg_out(struct trace_event_raw_sys_exit *ctx)
{
	return on_exit(ctx->ret);
}

SEC("tracepoint/sock/inet_sock_set_state")
int spy_tcp_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	__u64 sk = (__u64)ctx->skaddr;
	int os = ctx->oldstate, ns = ctx->newstate;
	struct rec_hdr h = {};
	struct conn *c;
	__u8 role;

	if (ctx->protocol != IPPROTO_TCP)
		return 0;
	if (ns == TCP_ESTABLISHED) {
		role = os == TCP_SYN_SENT ? R_CLIENT : os == TCP_SYN_RECV ? R_SERVER : R_UNKNOWN;
		if (role != R_UNKNOWN)
			bpf_map_update_elem(&roles, &sk, &role, BPF_ANY);
		return 0;
	}
	if (ns == TCP_CLOSE)
		bpf_map_delete_elem(&roles, &sk);
	c = bpf_map_lookup_elem(&conns, &sk);
	if (!c)
		return 0;
	h.ts = bpf_ktime_get_ns();
	h.sk = sk;
	h.serial = c->serial;
	h.role = c->role;
	h.state = os;
	h.fd = -1;
	h.family = ctx->family;
	h.lport = ctx->sport;
	h.rport = ctx->dport;
	if (ctx->family == AF_INET) {
		bpf_probe_read_kernel(h.laddr, 4, ctx->saddr);
		bpf_probe_read_kernel(h.raddr, 4, ctx->daddr);
	} else {
		bpf_probe_read_kernel(h.laddr, 16, ctx->saddr_v6);
		bpf_probe_read_kernel(h.raddr, 16, ctx->daddr_v6);
	}
	if (ns == TCP_CLOSE) {
		h.kind = K_CLOSE;
		h.offset = c->off[D_SENT];
		h.aux = c->off[D_RECV];
		emit_small(&h);
		bpf_map_delete_elem(&conns, &sk);
		return 0;
	}
	if ((os == TCP_ESTABLISHED && ns == TCP_FIN_WAIT1) ||
	    (os == TCP_CLOSE_WAIT && ns == TCP_LAST_ACK)) {
		h.kind = K_SHUTDOWN;
		h.dir = D_SENT;
		h.offset = c->off[D_SENT];
		emit_small(&h);
	}
	return 0;
}
