/* librdmacm's calls the Debian programs leave out, as rdma-core's
 * header declares them, run on rdmacm-abi: a non-blocking channel, a
 * listener and a client in one process, a reject and an accept each with
 * private data, and a disconnect seen by both sides. Prints one line per
 * step for the test to compare. Usage: cm_program ADDRESS PORT */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *get(struct rdma_event_channel *ch, int want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		exit(1);
	}
	if (e->event != want) {
		printf("unexpected %s status %d (wanted %s)\n", rdma_event_str(e->event),
		       e->status, rdma_event_str(want));
		exit(1);
	}
	return e;
}

static void qp_on(struct rdma_cm_id *id)
{
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (!pd || !cq || rdma_create_qp(id, pd, &a)) {
		perror("qp");
		exit(1);
	}
}

static struct rdma_cm_id *client(struct rdma_event_channel *ch, struct sockaddr_in *dst)
{
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000)) {
		perror("client");
		exit(1);
	}
	rdma_ack_cm_event(get(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000)) {
		perror("route");
		exit(1);
	}
	rdma_ack_cm_event(get(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	printf("route paths %d\n", id->route.num_paths);
	qp_on(id);
	return id;
}

static void connect_with(struct rdma_cm_id *id, const char *data)
{
	struct rdma_conn_param p = { .private_data = data, .private_data_len = strlen(data) + 1,
		.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
		.rnr_retry_count = 7 };
	if (rdma_connect(id, &p)) {
		perror("rdma_connect");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *cs = rdma_create_event_channel();
	struct rdma_event_channel *cc = rdma_create_event_channel();
	struct rdma_cm_id *listener, *c1, *c2, *child;
	struct rdma_cm_event *e;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	int fl, r;

	inet_pton(AF_INET, argv[1], &sin.sin_addr);
	/* A non-blocking channel with nothing queued. */
	fl = fcntl(cc->fd, F_GETFL);
	fcntl(cc->fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	r = rdma_get_cm_event(cc, &e);
	printf("nonblocking %d %d\n", r, errno == EAGAIN);
	fcntl(cc->fd, F_SETFL, fl);

	if (rdma_create_id(cs, &listener, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)&sin) || rdma_listen(listener, 4)) {
		perror("listen");
		return 1;
	}
	printf("listening on %d\n", ntohs(rdma_get_src_port(listener)));

	/* Refused, with private data both ways. */
	c1 = client(cc, &sin);
	connect_with(c1, "hello-rdmacm");
	e = get(cs, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = e->id;
	printf("request \"%s\" listener %d port %d\n", (const char *)e->param.conn.private_data,
	       e->listen_id == listener, ntohs(rdma_get_dst_port(child)) == ntohs(rdma_get_src_port(c1)));
	rdma_ack_cm_event(e);
	if (rdma_reject(child, "no-thanks", 10)) {
		perror("rdma_reject");
		return 1;
	}
	rdma_destroy_id(child);
	e = get(cc, RDMA_CM_EVENT_REJECTED);
	printf("rejected %d \"%s\"\n", e->status, (const char *)e->param.conn.private_data);
	rdma_ack_cm_event(e);

	/* Accepted, with private data both ways, then disconnected. */
	c2 = client(cc, &sin);
	connect_with(c2, "again");
	e = get(cs, RDMA_CM_EVENT_CONNECT_REQUEST);
	child = e->id;
	printf("request \"%s\"\n", (const char *)e->param.conn.private_data);
	rdma_ack_cm_event(e);
	qp_on(child);
	{
		struct rdma_conn_param p = { .private_data = "welcome", .private_data_len = 8,
			.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7 };
		if (rdma_accept(child, &p)) {
			perror("rdma_accept");
			return 1;
		}
	}
	e = get(cc, RDMA_CM_EVENT_ESTABLISHED);
	printf("established \"%s\" qp %d\n", (const char *)e->param.conn.private_data,
	       e->param.conn.qp_num == child->qp->qp_num);
	rdma_ack_cm_event(e);
	rdma_ack_cm_event(get(cs, RDMA_CM_EVENT_ESTABLISHED));
	printf("both established, client QP state %d\n", c2->qp->state);
	rdma_disconnect(c2);
	rdma_ack_cm_event(get(cc, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(get(cs, RDMA_CM_EVENT_DISCONNECTED));
	printf("both disconnected\n");
	rdma_destroy_qp(c2);
	rdma_destroy_qp(child);
	rdma_destroy_id(c2);
	rdma_destroy_id(child);
	rdma_destroy_id(c1);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(cs);
	rdma_destroy_event_channel(cc);
	printf("done\n");
	return 0;
}
