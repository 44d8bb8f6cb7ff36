/* Probes the extended QP API (ibv_create_qp_ex + ibv_wr_*), which the Rust
 * bindings cannot reach (static inlines): two RC QPs on one device connected
 * to each other, one SEND and one RDMA WRITE posted with ibv_wr_*, contents
 * checked. Prints one capability-table row; exit 0 if both ran.
 * Usage: wr-probe DEVICE GID_INDEX */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *fail(const char *what) {
    static char buf[256];
    snprintf(buf, sizeof buf, "%s failed", what);
    return buf;
}

static int wait_cq(struct ibv_cq *cq, int n) {
    struct ibv_wc wc;
    time_t end = time(NULL) + 5;
    while (n > 0 && time(NULL) < end) {
        int got = ibv_poll_cq(cq, 1, &wc);
        if (got < 0 || (got == 1 && wc.status != IBV_WC_SUCCESS)) return -1;
        n -= got;
    }
    return n == 0 ? 0 : -1;
}

static const char *run(const char *name, int gid_index) {
    int num;
    struct ibv_device **list = ibv_get_device_list(&num), *dev = NULL;
    for (int i = 0; list && i < num; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name)) dev = list[i];
    if (!dev) return "device not found";
    struct ibv_context *ctx = ibv_open_device(dev);
    if (!ctx) return fail("ibv_open_device");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    static char mem[8192];
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!pd || !cq || !mr) return fail("setup");
    struct ibv_port_attr port;
    union ibv_gid gid;
    if (ibv_query_port(ctx, 1, &port) || ibv_query_gid(ctx, 1, gid_index, &gid)) return fail("query port/gid");
    struct ibv_qp_init_attr_ex ia = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
        .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
        .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
    };
    struct ibv_qp *a = ibv_create_qp_ex(ctx, &ia), *b = ibv_create_qp_ex(ctx, &ia);
    if (!a || !b) return fail("ibv_create_qp_ex with send_ops_flags");
    struct ibv_qp *qps[2] = { a, b };
    for (int i = 0; i < 2; i++) {
        struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                                  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
        if (ibv_modify_qp(qps[i], &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
            return fail("INIT");
        struct ibv_qp_attr rtr = { .qp_state = IBV_QPS_RTR, .path_mtu = port.active_mtu,
                                   .dest_qp_num = qps[1 - i]->qp_num, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
                                   .ah_attr = { .is_global = 1, .port_num = 1, .dlid = port.lid,
                                                .grh = { .dgid = gid, .sgid_index = gid_index, .hop_limit = 64 } } };
        if (ibv_modify_qp(qps[i], &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
            return fail("RTR");
        struct ibv_qp_attr rts = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1 };
        if (ibv_modify_qp(qps[i], &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                            IBV_QP_MAX_QP_RD_ATOMIC))
            return fail("RTS");
    }
    struct ibv_sge rs = { (uintptr_t)(mem + 4096), 64, mr->lkey };
    struct ibv_recv_wr rw = { .sg_list = &rs, .num_sge = 1 }, *bad;
    if (ibv_post_recv(b, &rw, &bad)) return fail("ibv_post_recv");
    memset(mem, 0x42, 64);
    struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
    ibv_wr_start(x);
    x->wr_id = 1;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(x);
    ibv_wr_set_sge(x, mr->lkey, (uintptr_t)mem, 64);
    x->wr_id = 2;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)(mem + 6144));
    ibv_wr_set_sge(x, mr->lkey, (uintptr_t)mem, 64);
    if (ibv_wr_complete(x)) return fail("ibv_wr_complete");
    if (wait_cq(cq, 3)) return "posted, but completions failed or timed out";
    for (int i = 0; i < 64; i++)
        if (mem[4096 + i] != 0x42 || mem[6144 + i] != 0x42) return "ran, but the data differs";
    return NULL;
}

int main(int argc, char **argv) {
    const char *err = run(argc > 1 ? argv[1] : "rxe0", argc > 2 ? atoi(argv[2]) : 0);
    printf("| Extended QP (ibv_wr_*) | %s | not used: classic ibv_post_send |\n",
           err ? err : "yes (ran: ibv_wr_send and ibv_wr_rdma_write through ibv_create_qp_ex, data checked)");
    return err ? 1 : 0;
}
