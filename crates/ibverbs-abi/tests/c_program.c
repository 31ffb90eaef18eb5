/* A C program of the library's tests (tests/c_program.rs): written against
 * Debian's <infiniband/verbs.h>, linked against this library, run on a
 * NIC daemon. It checks what the pingpong tools do not: the refusals
 * (EOPNOTSUPP, never a crash) of what is not served, the header's inline
 * extended verbs, a QP connected to itself moving data by SEND with
 * immediate and RDMA WRITE into heap memory the program registered, and
 * the non-blocking event reads. Prints "OK" and exits 0, or prints the
 * failed check and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                            \
	do {                                                                \
		if (!(c)) {                                                 \
			printf("FAIL line %d: %s (errno %d)\n", __LINE__, #c, \
			       errno);                                      \
			return 1;                                           \
		}                                                           \
	} while (0)

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1 && list[1] == NULL);
	CHECK(strcmp(ibv_get_device_name(list[0]), "nicd0") == 0);
	struct ibv_context *c = ibv_open_device(list[0]);
	CHECK(c);

	struct ibv_port_attr pa;
	CHECK(ibv_query_port(c, 1, &pa) == 0);
	CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(ibv_query_port(c, 2, &pa) != 0);
	union ibv_gid gid;
	CHECK(ibv_query_gid(c, 1, 0, &gid) == 0);
	CHECK(ibv_query_gid(c, 1, 5, &gid) == -1);
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(c, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2);

	/* The inline extended verbs find no extended ops. */
	struct ibv_device_attr_ex dax;
	CHECK(ibv_query_device_ex(c, NULL, &dax) == 0 && dax.orig_attr.phys_port_cnt == 1);
	struct ibv_cq_init_attr_ex cqa = { .cqe = 16 };
	errno = 0;
	CHECK(ibv_create_cq_ex(c, &cqa) == NULL && errno == EOPNOTSUPP);

	struct ibv_pd *pd = ibv_alloc_pd(c);
	CHECK(pd);
	errno = 0;
	CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP);

	struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
	CHECK(ch);
	struct ibv_cq *cq = ibv_create_cq(c, 16, (void *)0x77, ch, 0);
	CHECK(cq && cq->channel == ch && cq->cq_context == (void *)0x77);
	CHECK(ibv_resize_cq(cq, 32) == EOPNOTSUPP);

	/* Heap memory, bytes kept across registration. */
	unsigned char *buf = malloc(3 * 4096);
	CHECK(buf);
	for (int i = 0; i < 3 * 4096; i++)
		buf[i] = (unsigned char)(i * 7);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 3 * 4096, access);
	CHECK(mr && mr->addr == buf && mr->length == 3 * 4096);
	for (int i = 0; i < 3 * 4096; i++)
		CHECK(buf[i] == (unsigned char)(i * 7));
	errno = 0;
	CHECK(ibv_reg_mr_iova(pd, buf, 4096, 0x10000, access) == NULL && errno == EOPNOTSUPP);
	static const char text[] = "read-only data of the program";
	errno = 0;
	CHECK(ibv_reg_mr(pd, (void *)text, sizeof(text), IBV_ACCESS_LOCAL_WRITE) == NULL &&
	      errno == EINVAL);

	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qia);
	CHECK(qp && qp->qp_num != 0 && qp->state == IBV_QPS_RESET);
	struct ibv_qp_init_attr raw = qia;
	raw.qp_type = IBV_QPT_RAW_PACKET;
	errno = 0;
	CHECK(ibv_create_qp(pd, &raw) == NULL && errno == EOPNOTSUPP);

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = access };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_ALT_PATH) == EOPNOTSUPP);
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == 0);
	CHECK(qp->state == IBV_QPS_INIT);
	/* Connected to itself. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					    IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0);
	CHECK(a.qp_state == IBV_QPS_RTS && a.dest_qp_num == qp->qp_num &&
	      qi.cap.max_send_wr == 8 && qi.cap.max_inline_data == 64 && qi.send_cq == cq);

	/* SEND with immediate from page 0 into page 1. */
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 4096, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 11, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
	memset(buf, 0xa5, 64);
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 22, .sg_list = &ss, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_IMM,
				   .imm_data = htonl(0x1234) }, *sbad;
	CHECK(ibv_post_send(qp, &swr, &sbad) == 0);
	int got_send = 0, got_recv = 0;
	for (int k = 0; k < 2; k++) {
		struct ibv_wc wc;
		CHECK(poll_one(cq, &wc) == 1);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.qp_num == qp->qp_num);
		if (wc.wr_id == 22) {
			CHECK(wc.opcode == IBV_WC_SEND);
			got_send = 1;
		} else {
			CHECK(wc.wr_id == 11 && wc.opcode == IBV_WC_RECV && wc.byte_len == 64);
			CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0x1234));
			got_recv = 1;
		}
	}
	CHECK(got_send && got_recv);
	for (int i = 0; i < 64; i++)
		CHECK(buf[4096 + i] == 0xa5);

	/* RDMA WRITE into page 2: lands in the program's own heap memory. */
	memset(buf, 0x3c, 256);
	ss.length = 256;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.wr_id = 33;
	swr.wr.rdma.remote_addr = (uintptr_t)buf + 8192;
	swr.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(qp, &swr, &sbad) == 0);
	struct ibv_wc wc;
	CHECK(poll_one(cq, &wc) == 1);
	CHECK(wc.wr_id == 33 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
	for (int i = 0; i < 256; i++)
		CHECK(buf[8192 + i] == 0x3c);
	CHECK(buf[8192 + 256] == (unsigned char)((8192 + 256) * 7));

	/* Inline from memory nobody registered (a stack buffer, no L_Key),
	 * gathered from two pieces, as libibverbs allows. */
	unsigned char stackbuf[48];
	memset(stackbuf, 0x6b, sizeof(stackbuf));
	stackbuf[47] = 0x01;
	struct ibv_sge two[2] = {
		{ .addr = (uintptr_t)stackbuf, .length = 40, .lkey = 0 },
		{ .addr = (uintptr_t)stackbuf + 40, .length = 8, .lkey = 0 },
	};
	memset(buf + 4096, 0, 64);
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
	struct ibv_send_wr iwr = { .wr_id = 55, .sg_list = two, .num_sge = 2,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE }, *ibad;
	CHECK(ibv_post_send(qp, &iwr, &ibad) == 0);
	/* The buffer is the program's again at once. */
	memset(stackbuf, 0, sizeof(stackbuf));
	for (int k = 0; k < 2; k++) {
		CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
		if (wc.wr_id == 11)
			CHECK(wc.byte_len == 48);
	}
	for (int i = 0; i < 47; i++)
		CHECK(buf[4096 + i] == 0x6b);
	CHECK(buf[4096 + 47] == 0x01);

	/* An armed CQ's event on the channel. */
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
	swr.opcode = IBV_WR_SEND;
	swr.wr_id = 44;
	ss.length = 16;
	CHECK(ibv_post_send(qp, &swr, &sbad) == 0);
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq && ectx == (void *)0x77);
	ibv_ack_cq_events(cq, 1);
	for (int k = 0; k < 2; k++)
		CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	/* Nothing more: non-blocking reads say so. */
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN);
	CHECK(fcntl(c->async_fd, F_SETFL, fcntl(c->async_fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(c, &ev) == -1 && errno == EAGAIN);

	CHECK(strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error") == 0);
	CHECK(strcmp(ibv_wc_status_str(99), "unknown") == 0);
	CHECK(strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "PORT_ACTIVE") == 0);
	CHECK(ibv_attach_mcast(qp, &gid, 0) == EOPNOTSUPP);

	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	/* The memory is still the program's. */
	buf[0] = 1;
	free(buf);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(c) == 0);
	ibv_free_device_list(list);
	printf("OK\n");
	return 0;
}
