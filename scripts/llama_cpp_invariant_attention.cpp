// llamadecide: GGML_CPU_FA_INVARIANT=1 evaluates flash attention, at every batch size, with a kernel
// whose result for a query row depends only on that row and the KV cells it sees, taken in cell order:
// not on its batch-mates, nor on how many cells the view holds, nor on where tiles fall.
// - Scores come from tile GEMMs in which every score is one dot product over the head dimension,
//   accumulated in order (simd_gemm: one FMA chain per output element).
// - The softmax is taken against the row's maximum over all its cells (a maximum is exact in any
//   order), and every exponential goes through the same SIMD code (tiles are a multiple of its width).
// - The weighted sum of V, with a column of ones beside V that gives the softmax's denominator,
//   accumulates over the cells in cell order in one FMA chain per output element; masked cells
//   add exact zeros, and tiles no row of a block sees are skipped (adding nothing).
// The query heads that share a KV head are one GEMM block, so each K and V tile is converted once
// for all of them, and the mask once per token.
static bool ggml_fa_invariant(void) {
    static const bool on = [] {
        const char * env = getenv("GGML_CPU_FA_INVARIANT");
        return env != NULL && atoi(env) != 0;
    }();
    return on;
}

static void ggml_compute_forward_flash_attn_ext_invariant(
        const ggml_compute_params * params,
        ggml_tensor * dst) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    GGML_TENSOR_LOCALS(int64_t, neq, q,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbq, q,   nb)
    GGML_TENSOR_LOCALS(int64_t, nek, k,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbk, k,   nb)
    GGML_TENSOR_LOCALS(int64_t, nev, v,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbv, v,   nb)
    GGML_TENSOR_LOCALS(int64_t, ne,  dst, ne)
    GGML_TENSOR_LOCALS(size_t,  nb,  dst, nb)

    const int64_t DK = nek0;
    const int64_t DV = nev0;
    GGML_ASSERT(k->type == v->type && nek2 == nev2 && nek3 == nev3);
    const ggml_type kv_type = k->type;

    const int64_t rk2 = neq2/nek2;  // query heads per KV head
    const int64_t rk3 = neq3/nek3;

    float scale         = 1.0f;
    float max_bias      = 0.0f;
    float logit_softcap = 0.0f;
    memcpy(&scale,         (float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (float *) dst->op_params + 2, sizeof(float));
    if (logit_softcap != 0) {
        scale /= logit_softcap;
    }

    const uint32_t n_head      = neq2;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));
    const float m0 = powf(2.0f, -(max_bias       ) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);

    static constexpr int64_t KT    = ggml_fa_tile_config::KV;  // a multiple of every SIMD width: no scalar tail
    static constexpr int64_t ROWS  = 128;                       // query rows (tokens x heads) a block aims at
    const int64_t n_tiles = (nek1 + KT - 1)/KT;
    const int64_t DVW     = DV + 16;                            // V, then a column of ones (the denominator)

    // Work units: (sequence, KV head, block of tokens), the block's rows being every query head of that KV
    // head for every token of the block; as many units as threads at least.
    const int nth = params->nth;
    int64_t n_blocks = std::max<int64_t>(1, (neq1*rk2 + ROWS - 1)/ROWS);
    n_blocks = std::min<int64_t>(neq1, std::max<int64_t>(n_blocks, (nth + nek2*neq3 - 1)/(nek2*neq3)));
    const int64_t TB      = (neq1 + n_blocks - 1)/n_blocks;
    const int64_t n_units = neq3*nek2*n_blocks;
    const int64_t MAXR    = TB*rk2;

    thread_local std::vector<float> Qf, Kf, Krow, Vf, KQ, S, P, O, Mrow, slope;
    thread_local std::vector<char>  live;
    Qf.resize(MAXR*DK); Kf.resize(DK*KT); Vf.resize(KT*DVW); KQ.resize(MAXR*n_tiles*KT); S.resize(MAXR*KT);
    P.resize(MAXR*KT); O.resize(MAXR*DVW); Mrow.resize(MAXR); slope.resize(rk2); Krow.resize(DK);
    live.resize(n_tiles);

    for (int64_t unit = params->ith; unit < n_units; unit += nth) {
        const int64_t iq3 = unit/(nek2*n_blocks);
        const int64_t ik2 = (unit/n_blocks) % nek2;
        const int64_t t0  = (unit % n_blocks)*TB;
        if (t0 >= neq1) {
            continue;
        }
        const int64_t tn  = std::min(TB, neq1 - t0);
        const int64_t M   = rk2*tn;  // row r = j*tn + i: head ik2*rk2 + j, token t0 + i
        const int64_t ik3 = iq3/rk3;

        for (int64_t j = 0; j < rk2; j++) {
            const uint32_t h = ik2*rk2 + j;
            slope[j] = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1) : 1.0f;
            for (int64_t i = 0; i < tn; i++) {
                const float * pq = (const float *) ((const char *) q->data + (t0 + i)*nbq1 + h*nbq2 + iq3*nbq3);
                memcpy(Qf.data() + (j*tn + i)*DK, pq, DK*sizeof(float));
            }
        }
        for (int64_t r = 0; r < M; r++) {
            Mrow[r] = -INFINITY;
        }

        // Pass 1: every score of the block's rows, masked, and each row's maximum.
        for (int64_t t = 0; t < n_tiles; t++) {
            const int64_t ic = t*KT;
            const int64_t kv = std::min(KT, nek1 - ic);
            float * kq = KQ.data() + t*MAXR*KT;
            bool any = false;
            for (int64_t j = 0; j < rk2; j++) {
                const int64_t h = ik2*rk2 + j;
                for (int64_t i = 0; i < tn; i++) {
                    float * row = kq + (j*tn + i)*KT;
                    if (!mask) {
                        std::fill(row, row + kv, 0.0f);
                    } else if (j == 0 || mask->ne[2] > 1 || slope[j] != slope[0]) {
                        const ggml_fp16_t * mp = (const ggml_fp16_t *) ((const char *) mask->data + (t0 + i)*mask->nb[1] +
                                                  (h % mask->ne[2])*mask->nb[2] + (iq3 % mask->ne[3])*mask->nb[3]);
                        ggml_cpu_fp16_to_fp32(mp + ic, row, kv);
                        if (slope[j] != 1.0f) {
                            ggml_vec_scale_f32((int) kv, row, slope[j]);
                        }
                    } else {
                        memcpy(row, kq + i*KT, kv*sizeof(float));  // the same mask row as head 0's
                    }
                    std::fill(row + kv, row + KT, -INFINITY);
                    if (!any) {
                        int visible = 0;
                        for (int64_t c = 0; c < KT; c++) {
                            visible += row[c] != -INFINITY;
                        }
                        any = visible > 0;
                    }
                }
            }
            live[t] = any;
            if (!any) {
                continue;  // every weight in this tile is an exact zero for these rows
            }
            for (int64_t c = 0; c < KT; c++) {
                if (c < kv) {
                    const char * k_data = (const char *) k->data + (ic + c)*nbk1 + ik2*nbk2 + ik3*nbk3;
                    const float * krow = (const float *) k_data;
                    if (kv_type == GGML_TYPE_F16) {
                        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) k_data, Krow.data(), DK);
                        krow = Krow.data();
                    }
                    for (int64_t d = 0; d < DK; d++) {
                        Kf[d*KT + c] = krow[d];
                    }
                } else {
                    for (int64_t d = 0; d < DK; d++) {
                        Kf[d*KT + c] = 0.0f;
                    }
                }
            }
            std::fill(S.begin(), S.begin() + M*KT, 0.0f);
            simd_gemm(S.data(), Qf.data(), Kf.data(), (int) M, (int) DK, (int) KT);
            ggml_vec_scale_f32((int) (M*KT), S.data(), scale);
            if (logit_softcap != 0.0f) {
                ggml_vec_tanh_f32((int) (M*KT), S.data(), S.data());
                ggml_vec_scale_f32((int) (M*KT), S.data(), logit_softcap);
            }
            ggml_vec_add_f32((int) (M*KT), kq, kq, S.data());  // a masked score stays -inf
            for (int64_t r = 0; r < M; r++) {
                const float * row = kq + r*KT;
                float top = -INFINITY;
                for (int64_t c = 0; c < KT; c++) {
                    top = row[c] > top ? row[c] : top;
                }
                Mrow[r] = top > Mrow[r] ? top : Mrow[r];
            }
        }
        if (sinks) {
            for (int64_t j = 0; j < rk2; j++) {
                const float s = ((const float *) sinks->data)[ik2*rk2 + j];
                for (int64_t i = 0; i < tn; i++) {
                    Mrow[j*tn + i] = fmaxf(Mrow[j*tn + i], s);
                }
            }
        }

        // Pass 2: weights against each row's maximum, accumulated with V (and ones) in cell order.
        std::fill(O.begin(), O.begin() + M*DVW, 0.0f);
        for (int64_t t = 0; t < n_tiles; t++) {
            if (!live[t]) {
                continue;
            }
            const int64_t ic = t*KT;
            const int64_t kv = std::min(KT, nek1 - ic);
            const float * kq = KQ.data() + t*MAXR*KT;
            for (int64_t r = 0; r < M; r++) {
                if (Mrow[r] == -INFINITY) {
                    std::fill(P.begin() + r*KT, P.begin() + (r + 1)*KT, 0.0f);
                } else {
                    ggml_vec_soft_max_f32((int) KT, P.data() + r*KT, kq + r*KT, Mrow[r]);
                }
            }
            for (int64_t c = 0; c < KT; c++) {
                float * vrow = Vf.data() + c*DVW;
                if (c < kv) {
                    const char * v_data = (const char *) v->data + (ic + c)*nbv1 + ik2*nbv2 + ik3*nbv3;
                    if (kv_type == GGML_TYPE_F16) {
                        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) v_data, vrow, DV);
                    } else {
                        memcpy(vrow, v_data, DV*sizeof(float));
                    }
                } else {
                    std::fill(vrow, vrow + DV, 0.0f);
                }
                vrow[DV] = 1.0f;
                std::fill(vrow + DV + 1, vrow + DVW, 0.0f);
            }
            simd_gemm(O.data(), P.data(), Vf.data(), (int) M, (int) KT, (int) DVW);
        }

        for (int64_t j = 0; j < rk2; j++) {
            const int64_t h = ik2*rk2 + j;
            for (int64_t i = 0; i < tn; i++) {
                const int64_t r = j*tn + i;
                float * o = O.data() + r*DVW;
                float sum = o[DV];
                if (sinks) {
                    sum += expf(((const float *) sinks->data)[h] - Mrow[r]);
                }
                const float S_inv = sum == 0.0f ? 0.0f : 1.0f/sum;
                ggml_vec_scale_f32((int) DV, o, S_inv);
                memcpy((char *) dst->data + (iq3*ne2*ne1 + h + (t0 + i)*ne1)*nb1, o, nb1);
            }
        }
    }
}
