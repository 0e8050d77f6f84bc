# gnuplot script written by experiments/run.py; run: gnuplot e3_progressive.gp
$q0_0 << EOD
# ftrl s=0: samples prog
0.968 0.948347
1.936 0.963326
2.904 0.966253
3.872 0.970041
4.84 0.973554
EOD
$q0_1 << EOD
# ftrl s=8: samples prog
0.968 0.770349
1.936 0.8675
2.904 0.901954
3.872 0.919461
4.84 0.932231
EOD
$q0_2 << EOD
# ftrl s=32: samples prog
0.968 0.548203
1.936 0.668796
2.904 0.750633
3.872 0.797481
4.84 0.823347
EOD
$q1_0 << EOD
# adagrad s=0: samples prog
0.968 0.963843
1.936 0.97624
2.904 0.978994
3.872 0.981147
4.84 0.982851
EOD
$q1_1 << EOD
# adagrad s=8: samples prog
0.968 0.878876
1.936 0.93
2.904 0.946429
3.872 0.955539
4.84 0.961777
EOD
$q1_2 << EOD
# adagrad s=32: samples prog
0.968 0.69281
1.936 0.813412
2.904 0.861076
3.872 0.887597
4.84 0.902066
EOD
$q2_0 << EOD
# sgd s=0: samples prog
0.968 0.947314
1.936 0.96281
2.904 0.966598
3.872 0.969783
4.84 0.97376
EOD
$q2_1 << EOD
# sgd s=8: samples prog
0.968 0.748062
1.936 0.8525
2.904 0.892183
3.872 0.91311
4.84 0.927479
EOD
$q2_2 << EOD
# sgd s=32: samples prog
0.968 0.537582
1.936 0.652828
2.904 0.739557
3.872 0.787548
4.84 0.814463
EOD
set terminal pngcairo noenhanced size 1100,500 font ',10'
set output 'e3_progressive.png'
set multiplot layout 1,3 title 'E3: cumulative progressive accuracy over the pass (first seed)'
set grid
set xlabel 'training examples seen (thousands)'
set key bottom right
set xtics 1 format '%g'
set ylabel 'progressive accuracy'
set yrange [0.5:1]
set title 'ftrl (lr 0.1)'
plot $q0_0 using 1:2 with linespoints lw 2 title 's = 0', $q0_1 using 1:2 with linespoints lw 2 title 's = 8', $q0_2 using 1:2 with linespoints lw 2 title 's = 32'
set title 'adagrad (lr 0.1)'
plot $q1_0 using 1:2 with linespoints lw 2 title 's = 0', $q1_1 using 1:2 with linespoints lw 2 title 's = 8', $q1_2 using 1:2 with linespoints lw 2 title 's = 32'
set title 'sgd (lr 0.1)'
plot $q2_0 using 1:2 with linespoints lw 2 title 's = 0', $q2_1 using 1:2 with linespoints lw 2 title 's = 8', $q2_2 using 1:2 with linespoints lw 2 title 's = 32'
unset multiplot
set output
set terminal svg noenhanced size 1100,500 font ',10'
set output 'e3_progressive.svg'
set multiplot layout 1,3 title 'E3: cumulative progressive accuracy over the pass (first seed)'
set grid
set xlabel 'training examples seen (thousands)'
set key bottom right
set xtics 1 format '%g'
set ylabel 'progressive accuracy'
set yrange [0.5:1]
set title 'ftrl (lr 0.1)'
plot $q0_0 using 1:2 with linespoints lw 2 title 's = 0', $q0_1 using 1:2 with linespoints lw 2 title 's = 8', $q0_2 using 1:2 with linespoints lw 2 title 's = 32'
set title 'adagrad (lr 0.1)'
plot $q1_0 using 1:2 with linespoints lw 2 title 's = 0', $q1_1 using 1:2 with linespoints lw 2 title 's = 8', $q1_2 using 1:2 with linespoints lw 2 title 's = 32'
set title 'sgd (lr 0.1)'
plot $q2_0 using 1:2 with linespoints lw 2 title 's = 0', $q2_1 using 1:2 with linespoints lw 2 title 's = 8', $q2_2 using 1:2 with linespoints lw 2 title 's = 32'
unset multiplot
set output
