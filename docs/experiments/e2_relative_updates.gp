# gnuplot script written by experiments/run.py; run: gnuplot e2_relative_updates.gp
$r0 << EOD
# sgd: s relative sd
0 1 0
2 1.11746 0.149476
4 1.44921 0.370583
8 1.71111 0.544324
16 3.36667 0.22872
EOD
$r1 << EOD
# adam: s relative sd
0 1 0
2 1.86667 0.340343
4 3.63333 0.202073
8 6.06667 0.791096
16 13.4333 1.83394
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e2_relative_updates.png'
set multiplot layout 1,1 title 'E2: updates to reach the target, relative to s = 0 (points missing: target not reached)'
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
set multiplot layout 1,1 title 'E2: updates to reach the target, relative to s = 0 (points missing: target not reached)'
set grid
set xlabel 'staleness s (fixed)'
set ylabel 'updates(s) / updates(0)'
set key top left
set xrange [-1:17]
set xtics (0,2,4,8,16)
plot $r0 using 1:2:3 with yerrorlines lw 2 pt 7 title 'sgd', $r1 using 1:2:3 with yerrorlines lw 2 pt 7 title 'adam', 1 with lines dt 2 lc 'gray' notitle
unset multiplot
set output
