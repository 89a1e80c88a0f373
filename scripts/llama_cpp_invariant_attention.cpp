// llamadecide: GGML_CPU_FA_INVARIANT=1 evaluates flash attention, at every batch size, with a kernel
// whose result for a query row depends only on that row and the KV cells it sees, taken in cell order:
// not on its batch-mates, nor on how many cells the view holds, nor on where tiles fall. Scores come
// from tile GEMMs (each score a sequential dot product over the head dimension), the softmax uses the
// row's maximum over all its cells (a max is exact in any order), every exponential is computed by the
// same SIMD code, and the weighted sum of V (with a column of ones beside V that gives the softmax's
// denominator) accumulates over the cells in cell order, masked cells adding exact zeros.
static bool ggml_fa_invariant(void) {
    static const bool on = [] {
        const char * env = getenv("GGML_CPU_FA_INVARIANT");
        return env != NULL && atoi(env) != 0;
    }();
    return on;
}

static void ggml_compute_forward_flash_attn_ext_invariant(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        int ir0, int ir1) {
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
    GGML_ASSERT(k->type == v->type);
    const ggml_type kv_type = k->type;

    const int64_t rk2 = neq2/nek2;
    const int64_t rk3 = neq3/nek3;
    const int64_t rv2 = neq2/nev2;
    const int64_t rv3 = neq3/nev3;

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

    static constexpr int QT = ggml_fa_tile_config::Q;
    static constexpr int KT = ggml_fa_tile_config::KV;  // a multiple of every SIMD width: no scalar tail
    const int64_t n_tiles = (nek1 + KT - 1)/KT;
    const int64_t DVW     = DV + KT;                    // V, then a column of ones (the denominator), zero-padded

    thread_local std::vector<float> Qf, Kf, Vf, KQ, P, O;
    thread_local std::vector<char>  live;
    Qf.resize(QT*DK); Kf.resize(DK*KT); Vf.resize(KT*DVW);
    KQ.resize((size_t) QT*n_tiles*KT); P.resize(QT*KT); O.resize(QT*DVW);
    live.resize(n_tiles);

    int ir = ir0;
    while (ir < ir1) {
        const int iq3 = ir/(neq2*neq1);
        const int iq2 = (ir - iq3*neq2*neq1)/neq1;
        const int iq1 = (ir - iq3*neq2*neq1 - iq2*neq1);
        const int rows = MIN(QT, MIN((int)(ir1 - ir), (int)(neq1 - iq1)));

        const uint32_t h = iq2;
        const float slope = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2*(h - n_head_log2) + 1) : 1.0f;
        const int ik2 = iq2/rk2, ik3 = iq3/rk3, iv2 = iq2/rv2, iv3 = iq3/rv3;

        for (int r = 0; r < rows; r++) {
            const float * pq = (const float *) ((char *) q->data + ((iq1 + r)*nbq1 + iq2*nbq2 + iq3*nbq3));
            memcpy(Qf.data() + r*DK, pq, DK*sizeof(float));
        }

        // Pass 1: every score of the tile's rows, and each row's maximum.
        float M[QT];
        for (int r = 0; r < QT; r++) {
            M[r] = -INFINITY;
        }
        for (int64_t t = 0; t < n_tiles; t++) {
            const int64_t ic = t*KT;
            const int kv = (int) std::min((int64_t) KT, nek1 - ic);
            float * kq = KQ.data() + t*QT*KT;
            bool any = !mask;
            for (int r = 0; r < rows; r++) {
                float * row = kq + r*KT;
                if (mask) {
                    const ggml_fp16_t * mp = (const ggml_fp16_t *)((const char *) mask->data + (iq1 + r)*mask->nb[1] + (iq2%mask->ne[2])*mask->nb[2] + (iq3%mask->ne[3])*mask->nb[3]);
                    for (int c = 0; c < kv; c++) {
                        row[c] = slope*GGML_CPU_FP16_TO_FP32(mp[ic + c]);
                        any = any || row[c] != -INFINITY;
                    }
                } else {
                    for (int c = 0; c < kv; c++) {
                        row[c] = 0.0f;
                    }
                }
                for (int c = kv; c < KT; c++) {
                    row[c] = -INFINITY;
                }
            }
            live[t] = any;
            if (!any) {
                continue;  // every weight in this tile is an exact zero for these rows
            }
            for (int c = 0; c < kv; c++) {
                const char * k_data = (const char *) k->data + (ic + c)*nbk1 + ik2*nbk2 + ik3*nbk3;
                for (int64_t d = 0; d < DK; d++) {
                    Kf[d*KT + c] = kv_type == GGML_TYPE_F16 ? GGML_CPU_FP16_TO_FP32(((const ggml_fp16_t *) k_data)[d])
                                                            : ((const float *) k_data)[d];
                }
            }
            for (int c = kv; c < KT; c++) {
                for (int64_t d = 0; d < DK; d++) {
                    Kf[d*KT + c] = 0.0f;
                }
            }
            float scores[QT*KT];
            memset(scores, 0, sizeof(float)*rows*KT);
            simd_gemm(scores, Qf.data(), Kf.data(), rows, DK, KT);
            ggml_vec_scale_f32(rows*KT, scores, scale);
            if (logit_softcap != 0.0f) {
                ggml_vec_tanh_f32(rows*KT, scores, scores);
                ggml_vec_scale_f32(rows*KT, scores, logit_softcap);
            }
            for (int r = 0; r < rows; r++) {
                float * row = kq + r*KT;
                for (int c = 0; c < KT; c++) {
                    row[c] = row[c] == -INFINITY ? -INFINITY : scores[r*KT + c] + row[c];
                    M[r] = fmaxf(M[r], row[c]);
                }
            }
        }
        if (sinks) {
            const float s = ((const float *) sinks->data)[h];
            for (int r = 0; r < rows; r++) {
                M[r] = fmaxf(M[r], s);
            }
        }

        // Pass 2: weights against the row's maximum, accumulated with V in cell order.
        std::fill(O.begin(), O.begin() + rows*DVW, 0.0f);
        for (int64_t t = 0; t < n_tiles; t++) {
            if (!live[t]) {
                continue;
            }
            const int64_t ic = t*KT;
            const int kv = (int) std::min((int64_t) KT, nek1 - ic);
            const float * kq = KQ.data() + t*QT*KT;
            for (int r = 0; r < rows; r++) {
                if (M[r] == -INFINITY) {
                    memset(P.data() + r*KT, 0, KT*sizeof(float));
                } else {
                    ggml_vec_soft_max_f32(KT, P.data() + r*KT, kq + r*KT, M[r]);
                }
            }
            for (int c = 0; c < KT; c++) {
                float * vrow = Vf.data() + c*DVW;
                if (c < kv) {
                    const char * v_data = (const char *) v->data + (ic + c)*nbv1 + iv2*nbv2 + iv3*nbv3;
                    if (kv_type == GGML_TYPE_F16) {
                        ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) v_data, vrow, DV);
                    } else {
                        memcpy(vrow, v_data, DV*sizeof(float));
                    }
                } else {
                    memset(vrow, 0, DV*sizeof(float));
                }
                vrow[DV] = 1.0f;
                memset(vrow + DV + 1, 0, (DVW - DV - 1)*sizeof(float));
            }
            simd_gemm(O.data(), P.data(), Vf.data(), rows, KT, DVW);
        }

        for (int r = 0; r < rows; r++) {
            float * o = O.data() + r*DVW;
            float sum = o[DV];
            if (sinks) {
                sum += expf(((const float *) sinks->data)[h] - M[r]);
            }
            const float S_inv = sum == 0.0f ? 0.0f : 1.0f/sum;
            ggml_vec_scale_f32(DV, o, S_inv);
            memcpy((char *) dst->data + (iq3*ne2*ne1 + iq2 + (iq1 + r)*ne1)*nb1, o, nb1);
        }
        ir += rows;
    }
}
