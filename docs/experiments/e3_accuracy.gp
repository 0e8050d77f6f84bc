# gnuplot script written by experiments/run.py; run: gnuplot e3_accuracy.gp
$a0 << EOD
# ftrl: s prog prog_ci95 test test_ci95
0 0.973554 0 0.985112 0
8 0.932231 0 0.981803 0
32 0.823347 0 0.970223 0
EOD
$a1 << EOD
# adagrad: s prog prog_ci95 test test_ci95
0 0.982851 0 0.992556 0
8 0.961777 0 0.989247 0
32 0.902066 0 0.98263 0
EOD
$a2 << EOD
# sgd: s prog prog_ci95 test test_ci95
0 0.97376 0 0.98842 0
8 0.927479 0 0.983457 0
32 0.814463 0 0.965261 0
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e3_accuracy.png'
set multiplot layout 1,2 title 'E3: SpamAssassin sparse-lr, one pass in file order, batch 8; mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set xlabel 'staleness s (fixed)'
set xtics (0,8,32)
set xrange [-2:34]
set key bottom left
set ylabel 'progressive accuracy'
plot $a0 using 1:2:3 with yerrorlines lw 2 pt 7 title 'ftrl', $a1 using 1:2:3 with yerrorlines lw 2 pt 7 title 'adagrad', $a2 using 1:2:3 with yerrorlines lw 2 pt 7 title 'sgd'
set ylabel 'final test accuracy'
plot $a0 using 1:4:5 with yerrorlines lw 2 pt 7 title 'ftrl', $a1 using 1:4:5 with yerrorlines lw 2 pt 7 title 'adagrad', $a2 using 1:4:5 with yerrorlines lw 2 pt 7 title 'sgd'
unset multiplot
set output
set terminal svg noenhanced size 1100,500 font ',10'
set output 'e3_accuracy.svg'
set multiplot layout 1,2 title 'E3: SpamAssassin sparse-lr, one pass in file order, batch 8; mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set xlabel 'staleness s (fixed)'
set xtics (0,8,32)
set xrange [-2:34]
set key bottom left
set ylabel 'progressive accuracy'
plot $a0 using 1:2:3 with yerrorlines lw 2 pt 7 title 'ftrl', $a1 using 1:2:3 with yerrorlines lw 2 pt 7 title 'adagrad', $a2 using 1:2:3 with yerrorlines lw 2 pt 7 title 'sgd'
set ylabel 'final test accuracy'
plot $a0 using 1:4:5 with yerrorlines lw 2 pt 7 title 'ftrl', $a1 using 1:4:5 with yerrorlines lw 2 pt 7 title 'adagrad', $a2 using 1:4:5 with yerrorlines lw 2 pt 7 title 'sgd'
unset multiplot
set output
