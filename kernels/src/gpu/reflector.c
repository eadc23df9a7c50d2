/*
 * LAPACK slarfg's scalars for one column (alpha, x), shared by the GPU QR kernels
 * (kernels/sources.py FAMILIES: gpu_panel, gpu_panel_small, gpu_steps, gpu_whole).
 *
 * From alpha and xn2 = ||x||^2 (summed in double, so graded, huge and tiny columns
 * neither overflow nor underflow): beta = -sign(alpha) ||(alpha, x)||, the Householder
 * scale tau = (beta - alpha) / beta and 1 / (alpha - beta), which scales x into v
 * (v[0] = 1 implicit).  x = 0 leaves H = I: beta = alpha, tau = 0, scale 0.
 */
static double reflector_beta(double alpha, double xn2)
{
    return xn2 > 0.0 ? -copysign(sqrt(alpha * alpha + xn2), alpha) : alpha;
}

static double reflector_tau(double alpha, double beta, double xn2)
{
    return xn2 > 0.0 ? (beta - alpha) / beta : 0.0;
}

static double reflector_scale(double alpha, double beta, double xn2)
{
    return xn2 > 0.0 ? 1.0 / (alpha - beta) : 0.0;
}
