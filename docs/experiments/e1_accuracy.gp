# gnuplot script written by experiments/run.py; run: gnuplot e1_accuracy.gp
$p0 << EOD
# none: M acc acc_ci95 loss loss_ci95
1 0.823433 0.0450388 0.479412 0.0962345
4 0.810433 0.094281 0.514298 0.223058
8 0.765067 0.0418833 0.635036 0.262409
16 0.665633 0.118845 0.971101 0.190386
EOD
$p1 << EOD
# lr_over_tau: M acc acc_ci95 loss loss_ci95
1 0.823433 0.0450388 0.479412 0.0962345
4 0.8174 0.0435886 0.501022 0.0996687
8 0.814633 0.029305 0.519757 0.0681923
16 0.793467 0.0509194 0.573741 0.10979
EOD
$p2 << EOD
# dc_constant: M acc acc_ci95 loss loss_ci95
1 0.823433 0.0450388 0.479412 0.0962345
4 0.8106 0.0782168 0.517738 0.191537
8 0.753033 0.0270888 0.668037 0.228067
16 0.693567 0.0992711 0.823642 0.224479
EOD
$p3 << EOD
# dc_adaptive: M acc acc_ci95 loss loss_ci95
1 0.823433 0.0450388 0.479412 0.0962345
4 0.8126 0.076189 0.511372 0.191267
8 0.757867 0.0630035 0.657563 0.264811
16 0.7239 0.102121 0.781976 0.434907
EOD
$p4 << EOD
# sync: M acc acc_ci95 loss loss_ci95
1 0.823433 0.0450388 0.479412 0.0962345
4 0.802533 0.0406266 0.567192 0.153794
8 0.789633 0.0405353 0.603498 0.0853466
16 0.7533 0.0233963 0.699435 0.0436438
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e1_accuracy.png'
set multiplot layout 1,2 title 'E1: fashion-mnist MLP, 1872 pushes, exp compute times (M=1: sequential); mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set logscale x 2
set xrange [0.8:20]
set xtics (1,4,8,16)
set xlabel 'workers M'
set key bottom left
set ylabel 'test accuracy'
plot $p0 using ($1*0.94):2:3 with yerrorlines lw 2 title 'none', $p1 using ($1*0.97):2:3 with yerrorlines lw 2 title 'lr_over_tau', $p2 using ($1*1.00):2:3 with yerrorlines lw 2 title 'dc_constant', $p3 using ($1*1.03):2:3 with yerrorlines lw 2 title 'dc_adaptive', $p4 using ($1*1.06):2:3 with yerrorlines lw 2 title 'sync'
set key top left
set ylabel 'test loss'
plot $p0 using ($1*0.94):4:5 with yerrorlines lw 2 title 'none', $p1 using ($1*0.97):4:5 with yerrorlines lw 2 title 'lr_over_tau', $p2 using ($1*1.00):4:5 with yerrorlines lw 2 title 'dc_constant', $p3 using ($1*1.03):4:5 with yerrorlines lw 2 title 'dc_adaptive', $p4 using ($1*1.06):4:5 with yerrorlines lw 2 title 'sync'
unset multiplot
set output
set terminal svg noenhanced size 1100,500 font ',10'
set output 'e1_accuracy.svg'
set multiplot layout 1,2 title 'E1: fashion-mnist MLP, 1872 pushes, exp compute times (M=1: sequential); mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set logscale x 2
set xrange [0.8:20]
set xtics (1,4,8,16)
set xlabel 'workers M'
set key bottom left
set ylabel 'test accuracy'
plot $p0 using ($1*0.94):2:3 with yerrorlines lw 2 title 'none', $p1 using ($1*0.97):2:3 with yerrorlines lw 2 title 'lr_over_tau', $p2 using ($1*1.00):2:3 with yerrorlines lw 2 title 'dc_constant', $p3 using ($1*1.03):2:3 with yerrorlines lw 2 title 'dc_adaptive', $p4 using ($1*1.06):2:3 with yerrorlines lw 2 title 'sync'
set key top left
set ylabel 'test loss'
plot $p0 using ($1*0.94):4:5 with yerrorlines lw 2 title 'none', $p1 using ($1*0.97):4:5 with yerrorlines lw 2 title 'lr_over_tau', $p2 using ($1*1.00):4:5 with yerrorlines lw 2 title 'dc_constant', $p3 using ($1*1.03):4:5 with yerrorlines lw 2 title 'dc_adaptive', $p4 using ($1*1.06):4:5 with yerrorlines lw 2 title 'sync'
unset multiplot
set output
