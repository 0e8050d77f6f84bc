# gnuplot script written by experiments/run.py; run: gnuplot e2_relative_updates.gp
$r0 << EOD
# sgd: s relative ci95
0 1 0
2 1.11746 0.37135
4 1.44921 0.920654
8 1.71111 1.35229
16 3.36667 0.568218
EOD
$r1 << EOD
# adam: s relative ci95
0 1 0
2 1.86667 0.845527
4 3.63333 0.502017
8 6.06667 1.96535
16 13.4333 4.55613
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e2_relative_updates.png'
set multiplot layout 1,1 title 'E2: updates to reach the target, relative to s = 0 (points missing: target not reached); mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set xlabel 'staleness s (fixed)'
set ylabel 'updates(s) / updates(0)'
set key top left
set xrange [-1:17]
set xtics (0,2,4,8,16)
plot $r0 using 1:2:3 with yerrorlines lw 2 pt 7 title 'sgd', $r1 using 1:2:3 with yerrorlines lw 2 pt 7 title 'adam', 1 with lines dt 2 lc 'gray' notitle
unset multiplot
set output
set terminal svg noenhanced size 1100,500 font ',10'
set output 'e2_relative_updates.svg'
set multiplot layout 1,1 title 'E2: updates to reach the target, relative to s = 0 (points missing: target not reached); mean over seeds, error bars: 95% CI of the mean over 3 seeds (t)'
set grid
set xlabel 'staleness s (fixed)'
set ylabel 'updates(s) / updates(0)'
set key top left
set xrange [-1:17]
set xtics (0,2,4,8,16)
plot $r0 using 1:2:3 with yerrorlines lw 2 pt 7 title 'sgd', $r1 using 1:2:3 with yerrorlines lw 2 pt 7 title 'adam', 1 with lines dt 2 lc 'gray' notitle
unset multiplot
set output
