# gnuplot script written by experiments/run.py; run: gnuplot e1_accuracy.gp
$p0 << EOD
# none: M acc acc_sd loss loss_sd
1 0.823433 0.0181291 0.479412 0.0387365
4 0.810433 0.0379501 0.514298 0.0897856
8 0.765067 0.0168589 0.635036 0.105625
16 0.665633 0.0478379 0.971101 0.0766344
EOD
$p1 << EOD
# lr_over_tau: M acc acc_sd loss loss_sd
1 0.823433 0.0181291 0.479412 0.0387365
4 0.8174 0.0175454 0.501022 0.0401188
8 0.814633 0.0117959 0.519757 0.0274489
16 0.793467 0.0204962 0.573741 0.044193
EOD
$p2 << EOD
# dc_constant: M acc acc_sd loss loss_sd
1 0.823433 0.0181291 0.479412 0.0387365
4 0.8106 0.031484 0.517738 0.077098
8 0.753033 0.0109038 0.668037 0.0918019
16 0.693567 0.0399588 0.823642 0.0903578
EOD
$p3 << EOD
# dc_adaptive: M acc acc_sd loss loss_sd
1 0.823433 0.0181291 0.479412 0.0387365
4 0.8126 0.0306677 0.511372 0.0769892
8 0.757867 0.0253603 0.657563 0.106592
16 0.7239 0.0411058 0.781976 0.175059
EOD
$p4 << EOD
# sync: M acc acc_sd loss loss_sd
1 0.823433 0.0181291 0.479412 0.0387365
4 0.802533 0.0163531 0.567192 0.0619054
8 0.789633 0.0163164 0.603498 0.0343539
16 0.7533 0.00941754 0.699435 0.0175676
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e1_accuracy.png'
set multiplot layout 1,2 title 'E1: fashion-mnist MLP, 1872 pushes, exp compute times (M=1: sequential)'
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
set multiplot layout 1,2 title 'E1: fashion-mnist MLP, 1872 pushes, exp compute times (M=1: sequential)'
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
